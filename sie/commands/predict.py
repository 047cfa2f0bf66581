"""`sie predict -f SPEC --input JSON`: one synchronous inference, no Kafka.

The spec is checked against this node's policy and the model loaded under it, as a worker would
(``SIE_ALLOWED_MODULES``, ``SIE_MODEL_ROOTS``; the spec file's folder counts as a model root, as for
``sie validate``), the request is parsed and validated by the scorer's codec, the
output is checked against ``outputSchema``, and the result is printed exactly as the scorer would publish
it.  A request the scorer would dead-letter prints ``dead letter <reason>: <detail>`` and exits 4.

An sglang spec naming running servers (``endpoints``/``server_url``, allowed by ``SIE_SGLANG_ENDPOINTS``)
sends the request through the LLM window's own path (``sie.streams.llm.probe``: the configured protocol,
streamed if configured) and prints the result the window would publish (``usage``, ``timings``); no
endpoint answering prints ``dead letter unreachable: <each endpoint's last error>`` (the window would hold
the request, not dead-letter it).  Without servers the spec's ``server_entry`` (or SGLang) is launched as
the agent's worker would, its log kept in a temporary file whose last lines a failed start quotes.
"""

from __future__ import annotations

import sys
from pathlib import Path

import click

from sie.kernel.settings import Settings


def _read_input(text: str) -> bytes:
    if text == "-":
        return sys.stdin.buffer.read()
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            return path.read_bytes()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {path}: {exc.strerror}", param_hint="--input") from None
    return text.encode()


@click.command("predict")
@click.option("-f", "--file", "spec_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="ModelService spec (YAML or JSON).")
@click.option("--input", "input_text", required=True,
              help="The request: JSON ({\"inputs\": {...}} or the bare inputs), @FILE, or - for stdin.")
@click.option("--device", help="Override spec.backend.device (e.g. cpu).")
@click.pass_obj
def command(settings: Settings, spec_file: Path, input_text: str, device: str | None) -> None:
    """Score one request with the model of SPEC and print the result JSON (stdout); no Kafka involved."""
    from sie.commands._runtime import EXIT_PARTIAL
    from sie.schemas.spec import load
    from sie.schemas.spec_policy import SpecPolicy
    from sie.streams.llm.config import uses_window
    from sie.workers.load_check import load_for_predict, predict, predict_window

    spec = load(spec_file, settings)  # the model's code runs here: the node's policy first
    value = _read_input(input_text)
    if uses_window(spec):  # running servers: one request through the window's path and configured protocol
        prediction = predict_window(spec, value, settings)
    else:
        backend = load_for_predict(spec, SpecPolicy.from_settings(settings, extra_roots=[spec_file.resolve().parent]),
                                   device)
        try:
            prediction = predict(spec, backend, value, settings)
        finally:
            close = getattr(backend, "close", None)
            if close is not None:
                close()
    if prediction.value is None:
        click.echo(f"dead letter {prediction.reason}: {prediction.detail}", err=True)
        click.get_current_context().exit(EXIT_PARTIAL)
    click.echo(prediction.value.decode())
