"""Error classes shared by every plane.

Messages name the thing and the fix, e.g.
``spec.resources.gpuMemoryMb: must be >= 0 (got -5)``.  The CLI prints
``error: <message>`` on one line and exits non-zero.
"""


class SieError(Exception):
    """Base of every error SIE reports to a user; ``str()`` is the one-line reason."""

    exit_code = 1


class ConfigError(SieError):
    """Bad settings, bad files, missing tools (Java, Maven)."""


class SpecError(SieError):
    """An invalid ModelService spec; the message lists each field path and reason."""


class KafkaUnavailable(SieError):
    """The cluster did not answer in time."""
