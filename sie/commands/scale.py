"""`sie scale MODEL --replicas N` (or `--min A --max B`): a model's replica count without editing its YAML.

With ``--control-url`` (``SIE_CONTROL_URL``) it goes through the control API (``POST /v1/models/{name}/scale``: the
caller's role is checked and the change is an audit event, like an apply); without it, it re-publishes the applied
spec on the specs topic as ``sie apply`` does (Kafka credentials that may write it).  Either way the new spec is the
applied one with ``sla.min_replicas``/``sla.max_replicas`` replaced (``sie.schemas.spec_scale``), so `sie get models`
and the next `sie apply` of the YAML see it: re-applying the YAML puts its own count back.
"""

from __future__ import annotations

import json
from urllib.parse import quote

import click

from sie.kernel.errors import SieError
from sie.kernel.settings import Settings


@click.command("scale")
@click.argument("model")
@click.option("--replicas", type=int, default=None, help="A fixed count (min = max = N).")
@click.option("--min", "min_replicas", type=int, default=None, help="The autoscaler's lower bound (0: scale to zero).")
@click.option("--max", "max_replicas", type=int, default=None, help="The autoscaler's upper bound.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for Kafka or the API.")
@click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
              help="Go through this control plane's HTTP API instead of Kafka (token: SIE_API_TOKEN).")
@click.pass_obj
def command(settings: Settings, model: str, replicas: int | None, min_replicas: int | None, max_replicas: int | None,
            timeout: float, control_url: str | None) -> None:
    """Set MODEL's replica count (--replicas) or its autoscaling bounds (--min/--max); recorded like an apply."""
    from sie.schemas.spec_scale import scale_request

    ask = scale_request(replicas, min_replicas, max_replicas)  # refused before anything is read or sent
    if control_url:
        from sie.commands._api import ApiRefused, ControlApi

        api = ControlApi(settings, control_url, timeout=timeout)
        try:
            answer = api.request("POST", f"/v1/models/{quote(model, safe='')}/scale",
                                 json.dumps(ask.model_dump(exclude_none=True)))
        except ApiRefused as exc:
            body = exc.body if isinstance(exc.body, dict) else {}
            details = [f"  {e.get('field')}: {e.get('reason')}" for e in body.get("errors", [])
                       if e.get("reason") and e.get("reason") not in str(exc)]
            raise SieError("\n".join([str(exc), *details])) from None
        click.echo(f"scaled: {answer['name']} {answer['version']} {answer['change']} via {control_url}")
        return

    from sie.commands._runtime import require_kafka
    from sie.schemas.spec_scale import describe_change, scaled
    from sie.schemas.spec_store import publish_spec, read_specs

    require_kafka(settings)
    applied = read_specs(settings, timeout=timeout)
    spec = applied.get(model)
    if spec is None:
        known = ", ".join(sorted(applied)) or "none"
        raise SieError(f"model {model!r} is not applied on {settings.bootstrap_servers} (applied: {known}); "
                       "`sie apply -f SPEC` first")
    new = scaled(spec, ask)
    publish_spec(settings, new, timeout=timeout, ensure_topic=False)
    click.echo(f"scaled: {model} {new.version} {describe_change(spec, new)}")
