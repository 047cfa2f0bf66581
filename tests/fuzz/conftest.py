"""Hypothesis profiles of the fuzz suite.

``ci`` (the default) is bounded so the whole suite stays well under a minute on two cores; ``deep`` is for
a campaign (``SIE_FUZZ_PROFILE=deep pytest tests/fuzz``: 20,000 examples per test, or
``SIE_FUZZ_EXAMPLES``, no deadline, no per-test timeout; expect minutes per test).  Every example a campaign finds stays in the suite as an
explicit ``@example`` or plain test.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

PROFILE = os.environ.get("SIE_FUZZ_PROFILE", "ci")
_HERE = Path(__file__).resolve().parent

settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,  # two shared cores: wall-clock deadlines would be noise, the suite's total time is the bound
    suppress_health_check=[HealthCheck.too_slow],
    print_blob=True,
)
settings.register_profile(
    "deep",
    max_examples=int(os.environ.get("SIE_FUZZ_EXAMPLES", "20000")),  # a shorter campaign: SIE_FUZZ_EXAMPLES=3000
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=True,
)
settings.load_profile(PROFILE)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A deep campaign runs for minutes per test: lift pytest-timeout's per-test limit for the fuzz tests."""
    if PROFILE != "deep":
        return
    for item in items:
        if _HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.timeout(0))
