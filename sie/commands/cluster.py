"""`sie get nodes`, `sie get replicas`, `sie describe model NAME`: what the cluster is doing.

Decision: by default the CLI reads Kafka directly (nodes + recent heartbeats, the compacted
model-status topic the leader publishes, recent events), so it works when no control plane is up or
reachable; ``--control-url http://host:8470`` asks a control plane's HTTP API instead (same JSON),
with the bearer token of ``SIE_API_TOKEN`` (``sie.commands._api``).
``get nodes``/``get replicas`` are added to the ``get`` group of ``sie.commands.spec``.

Filters and pages (``--model``, ``--node``, ``--state``/``--phase``/``--status``, ``--limit N``, ``--after NAME``):
sent to the API (``GET /v1/replicas?model=...&limit=...``: the control plane filters and pages, ``sie.control.api.
listing``), and applied here to what Kafka (or a control plane of a release before, which answers everything) gave;
a page is the items sorted by name after ``--after`` (exclusive), and stderr says how to get the next one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import click

from sie.commands.spec import get
from sie.control.api.listing import MAX_LIMIT, NodeStatus  # no web stack: the API's enums and page size
from sie.kernel.errors import KafkaUnavailable, SieError
from sie.kernel.settings import Settings
from sie.schemas.replica_state import ReplicaState

_URL = click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
                    help="Ask this control plane's HTTP API instead of reading Kafka (token: SIE_API_TOKEN).")
_OUT = click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
_TIMEOUT = click.option("--timeout", type=float, default=20.0, show_default=True, help="Seconds to read Kafka.")
NODE_TIMEOUT_S = 6.0
_LIMIT = click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=None, metavar="N",
                      help="Show one page of at most N (sorted by name); stderr says how to get the next.  "
                           "[default: everything]")
_AFTER = click.option("--after", default=None, metavar="NAME",
                      help="Start after NAME (exclusive): the name the page before said to go on from.")
_MODEL = click.option("--model", default=None, metavar="NAME", help="Only this model's.")


def checked_name(kind: str, value: str | None, option: str) -> str | None:
    """``value`` of ``option`` if it is a valid ``kind`` name (``model``, ``replica``, ``node``: the rules the API
    checks, ``sie.control.api.listing.check_query``), else a usage error (exit 2) naming the rule."""
    from sie.control.api.errors import ApiError
    from sie.control.api.listing import check_query

    try:
        return check_query(option, value, kind)
    except ApiError as exc:
        raise click.BadParameter(exc.errors[0]["reason"], param_hint=f"'--{option}'") from None


def read_page(items: Sequence[Mapping[str, Any]], key: str, limit: int | None, after: str | None,
              **filters: str | None) -> tuple[list[Mapping[str, Any]], str | None]:
    """The items matching ``filters`` (a field -> the value it must have; None: any), then the page after
    ``after`` of at most ``limit`` (``sie.control.api.listing.page``, the API's rule): (page, the key to go on from or
    None).  Idempotent: what a control plane filtered and paged already stays as it is."""
    from sie.control.api.listing import page

    wanted = {k: v for k, v in filters.items() if v is not None}
    chosen = [i for i in items if all(i.get(k) == v for k, v in wanted.items())] if wanted else list(items)
    chosen.sort(key=lambda i: str(i[key]))
    found = page(chosen, lambda i: str(i[key]), limit, after)
    return list(found["items"]), found.get("next")


def json_text(items: Any) -> str:
    """``-o json``: indented by two, as ``json.dumps(items, indent=2)`` writes it but for non-ASCII text, which stays
    UTF-8; orjson: ``json`` indents in Python (0.2 s for 30,000 replicas), orjson in a hundredth of that."""
    import orjson

    return orjson.dumps(items, option=orjson.OPT_INDENT_2).decode()


def _query(**params: Any) -> str:
    given = {k: v for k, v in params.items() if v is not None}
    return "?" + urlencode(given) if given else ""


def say_next(command: str, next_name: str | None, **options: Any) -> None:
    """On stderr, the command line of the next page (the same filters), when there is one."""
    if next_name is None:
        return
    shown = " ".join(f"--{k.replace('_', '-')} {v}" for k, v in options.items() if v is not None)
    click.echo(f"(more: {command} {shown} --after {next_name})".replace("  ", " "), err=True)


def api_page(settings: Settings, control_url: str, path: str, field: str, key: str, limit: int | None,
             after: str | None, filters: Mapping[str, str | None], timeout: float = 20.0,
             fields: Mapping[str, str] | None = None) -> tuple[list[Mapping[str, Any]], str | None]:
    """One page from ``GET path?filters&limit&after``: the control plane's when it paged (its answer has ``next``);
    a control plane of a release before answers everything, which is then filtered and paged here (``fields``: a
    query parameter -> the item's field it filters, where the names differ: ``model`` is a model's ``name``)."""
    from sie.commands._api import ControlApi

    answer = ControlApi(settings, control_url, timeout=timeout).get(path + _query(**filters, limit=limit, after=after))
    items = answer[field]
    if limit is not None and "next" in answer:
        return items, answer["next"]
    return read_page(items, key, limit, after, **{(fields or {}).get(k, k): v for k, v in filters.items()})


def _http(settings: Settings, url: str, path: str) -> Any:
    from sie.commands._api import ControlApi

    return ControlApi(settings, url).get(path)


def _read_state(settings: Settings, topics: tuple[str, ...], timeout: float):
    """Replay the given control topics to their end into a ClusterState."""
    from sie.commands._runtime import require_kafka
    from sie.control.reconcile.feeder import StateFeeder
    from sie.control.reconcile.records import ClusterState

    require_kafka(settings)
    state = ClusterState()
    feeder = StateFeeder(settings, state, topics=topics).start()
    try:
        if not feeder.caught_up.wait(timeout):
            raise KafkaUnavailable(
                f"could not read the control topics on {settings.bootstrap_servers} within {timeout:g}s"
                + (f" ({feeder.last_error})" if feeder.last_error else "") + "; is Kafka up and `sie topics ensure` run?"
            )
    finally:
        feeder.stop()
    return state


def table(rows: Sequence[tuple[str, ...]]) -> None:
    """The rows in columns, written at once (30,000 replicas: one format and one write, not one per cell and row)."""
    line = "  ".join(f"{{:<{max(map(len, column))}}}" for column in zip(*rows))
    click.echo("\n".join(line.format(*row).rstrip() for row in rows))


def _ago(ms: int | None) -> str:
    if not ms:
        return "never"
    s = max(0.0, time.time() - ms / 1000)
    return f"{s:.0f}s ago" if s < 120 else f"{s / 60:.0f}m ago" if s < 7200 else f"{s / 3600:.0f}h ago"


# ------------------------------------------------------------------------------------------ nodes


def nodes_json(settings: Settings, control_url: str | None, timeout: float) -> list[dict[str, Any]]:
    if control_url:
        return _http(settings, control_url, "/v1/nodes")["nodes"]
    # events too: a `node_forgotten` event drops the heartbeats its node sent before (sie node forget)
    state = _read_state(settings, ("nodes", "heartbeats", "events"), timeout)
    return [v.to_json() for v in state.snapshot().node_views(time.time(), NODE_TIMEOUT_S)]


@get.command("nodes")
@_URL
@_OUT
@_TIMEOUT
@click.option("--status", type=click.Choice([s.value for s in NodeStatus]), default=None,
              help="Only the online or offline nodes.")
@_LIMIT
@_AFTER
@click.pass_obj
def get_nodes(settings: Settings, control_url: str | None, output: str, timeout: float, status: str | None,
              limit: int | None, after: str | None) -> None:
    """Registered nodes: online/offline (heartbeat within 6 s), tier, CPU, GPUs."""
    after = checked_name("node", after, "after")
    if control_url:
        nodes, next_name = api_page(settings, control_url, "/v1/nodes", "nodes", "name", limit, after,
                                    {"status": status})
    else:
        nodes, next_name = read_page(nodes_json(settings, None, timeout), "name", limit, after, status=status)
    say_next("sie get nodes", next_name, control_url=control_url, status=status,
             output=output if output != "table" else None, limit=limit)
    if output == "json":
        click.echo(json_text(nodes))
        return
    if not nodes:
        click.echo("(no nodes match)" if status or after else "(no nodes registered)")
        return
    rows = [("NAME", "STATUS", "TIER", "CPU", "GPUS", "LAST HEARTBEAT")]
    for n in nodes:
        gpus = ", ".join(
            f"{g['index']}:{g['product']} {g['memory_total_mb']}MiB" + ("*" if g["simulated"] else "") + ("" if g["healthy"] else " UNHEALTHY")
            for g in n["gpus"]
        ) or "-"
        rows.append((n["name"], n["status"], n["tier"] or "-", f"{n['cpu']:g}", gpus, _ago(n["last_heartbeat_ms"])))
    table(rows)
    if any(g["simulated"] for n in nodes for g in n["gpus"]):
        click.echo("(* simulated GPU)")


# ---------------------------------------------------------------------------------------- replicas


def statuses_json(settings: Settings, control_url: str | None, timeout: float) -> tuple[list[dict[str, Any]], Any]:
    """Every model's last published status (the API's, or the model-status topic's).  From Kafka it reads that
    topic alone: reading the specs topic as well would parse every spec (seconds at 1,000 models,
    bench/bench_scale.py) for nothing it shows."""
    if control_url:
        return _http(settings, control_url, "/v1/models")["models"], None
    state = _read_state(settings, ("model-status",), timeout)
    return [state.model_status[n] for n in sorted(state.model_status)], state


@get.command("replicas")
@_URL
@_OUT
@_TIMEOUT
@_MODEL
@click.option("--node", default=None, metavar="NAME", help="Only the replicas on this node.")
@click.option("--state", type=click.Choice([s.value for s in ReplicaState]), default=None,
              help="Only the replicas in this state.")
@_LIMIT
@_AFTER
@click.pass_obj
def get_replicas(settings: Settings, control_url: str | None, output: str, timeout: float, model: str | None,
                 node: str | None, state: str | None, limit: int | None, after: str | None) -> None:
    """Every desired replica: model, version, node, GPU, worker process, state and reason."""
    model, node = checked_name("model", model, "model"), checked_name("node", node, "node")
    after = checked_name("replica", after, "after")
    filters = {"model": model, "node": node, "state": state}
    if control_url:  # the control plane filters and pages (a release before: everything, done here)
        replicas, next_name = api_page(settings, control_url, "/v1/replicas", "replicas", "replica_id", limit, after,
                                       filters)
    else:  # the model-status topic: every model's status (a model's alone is not readable from it)
        models, _ = statuses_json(settings, None, timeout)
        rows = [r for m in models if model is None or m.get("name") == model for r in m.get("replicas") or ()]
        replicas, next_name = read_page(rows, "replica_id", limit, after, **filters)
    say_next("sie get replicas", next_name, control_url=control_url, **filters,
             output=output if output != "table" else None, limit=limit)
    if output == "json":
        click.echo(json_text(replicas))
        return
    if not replicas:
        click.echo("(no replicas match)" if any(filters.values()) or after else
                   "(no replicas: no model applied, or no control plane has reconciled yet)")
        return
    rows = [("REPLICA", "MODEL", "VERSION", "NODE", "GPU", "PROCESS", "STATE", "REASON")]
    for r in replicas:
        gpus = ",".join(map(str, r["gpu_indices"])) or ("-" if r["node"] else "")
        reason = r["reason"] or ""
        if r.get("other_version"):  # a rollout: the other version it serves from a process of its own
            reason = f"{reason}; serves {r['other_version']}" if reason else f"serves {r['other_version']}"
        rows.append((r["replica_id"], r["model"], r["version"], r["node"] or "-", gpus or "-", r.get("process") or "-",
                     r["state"], reason))
    table(rows)


# ---------------------------------------------------------------------------------------- describe


def _describe_data_path(settings: Settings, spec: Any) -> None:
    """Topics, records/s over the last minute, dead-letter rate, scorer lag (best effort: a line saying why
    when Kafka does not answer these)."""
    from sie.commands._datapath import group_lag, traffic

    t = spec.topics
    click.echo(f"Topics:      requests {t.requests}, results {t.results}, dead letters {t.dead_letters}")
    from sie.kernel.authz import NotAuthorized

    try:
        seen = traffic(settings, [t.requests, t.results, t.dead_letters])
        lag = group_lag(settings, spec.group_id, t.requests)
    except NotAuthorized as exc:  # the whole reason: the principal and the ACL it lacks
        click.echo(f"Traffic:     unavailable: {exc}")
        return
    except Exception as exc:  # KafkaException: a describe must still show the rest
        click.echo(f"Traffic:     unavailable ({str(exc).splitlines()[0][:200]})")
        return
    req, res, dlq = (seen.get(name) for name in (t.requests, t.results, t.dead_letters))
    if req is None:
        click.echo(f"Traffic:     (topic {t.requests} does not exist yet: nothing was sent)")
        return
    out = (res.records if res else 0) + (dlq.records if dlq else 0)
    dead_rate = f"{100.0 * dlq.records / out:.1f}% of outputs" if dlq and out else "0%"
    approx = "" if all(x is None or x.exact for x in (req, res, dlq)) else " (~: from offsets)"
    click.echo(f"Traffic:     last {req.window_s:.0f}s{approx}: requests {req.per_s:.2f}/s, results "
               f"{res.per_s if res else 0.0:.2f}/s, dead letters {dlq.per_s if dlq else 0.0:.2f}/s ({dead_rate})")
    click.echo(f"Lag:         {lag if lag is not None else '-'} request(s) not yet scored (group {spec.group_id}, "
               f"{req.partitions} partitions)")
    if lag and out == 0:  # requests wait and nothing came out: a backend outage, or no scorer at all
        click.echo(f"Scoring:     nothing committed in the last {req.window_s:.0f}s while {lag} request(s) wait: "
                   "see Phase and the replicas' reasons (a backend outage is named there)")


def leader_hint(settings: Settings, timeout: float) -> str | None:
    """None while a control plane is a member of the control group (one of them leads); else why the status read
    from Kafka is only the last one a leader published (nothing reconciles it now)."""
    from sie.kernel.admin import admin_client

    group = settings.names.control_group
    try:
        admin = admin_client(settings)
        description = admin.describe_consumer_groups([group], request_timeout=timeout)[group].result(timeout=timeout)
    except Exception as exc:  # no Describe right on the group, a broker that does not answer: say so, do not guess
        return f"unknown whether a control plane runs (group {group}: {str(exc).splitlines()[0][:160]})"
    if description.members:
        return None
    return (f"no control plane is running (group {group} has no members): the phase is the last one published; "
            "nothing reconciles or moves replicas until `sie control` runs")


@click.group("describe")
def describe() -> None:
    """Explain one object in detail."""


@describe.command("model")
@click.argument("name")
@_URL
@_TIMEOUT
@click.pass_obj
def describe_model(settings: Settings, name: str, control_url: str | None, timeout: float) -> None:
    """Spec summary, ready/desired, each replica's state, reason and cool-down, the model's topics with
    records/s over the last minute, dead-letter rate and scorer lag (read from Kafka), recent events."""
    if control_url:
        from sie.commands._api import ApiRefused

        try:
            model = _http(settings, control_url, f"/v1/models/{name}")
        except ApiRefused as exc:
            if exc.status != 404:
                raise
            raise SieError(f"model {name!r}: not found at {control_url} (sie get models lists applied models)") from None
        spec, events = model.get("spec"), model.get("events", [])
    else:
        state = _read_state(settings, ("specs", "model-status", "events"), timeout)
        model = state.model_status.get(name)
        spec_obj = state.specs.get(name)
        if model is None and spec_obj is None:
            known = ", ".join(sorted(set(state.specs) | set(state.model_status))) or "none"
            raise SieError(f"model {name!r} is not applied (applied: {known})")
        spec = None
        if spec_obj is not None:
            spec = {"version": spec_obj.version, "priority_level": spec_obj.priority_level, "service_type": spec_obj.service_type,
                    "backend": spec_obj.backend.type, "resources": spec_obj.resources.model_dump(mode="json"),
                    "min_replicas": spec_obj.sla.min_replicas, "max_replicas": spec_obj.sla.max_replicas}
        from sie.control.reconcile.observability import event_rows

        events = event_rows((e for e in state.snapshot().events if e.model == name), 15)
        model = model or {"name": name, "phase": "Pending", "reason": "no control plane has reconciled it yet", "replicas": []}
    hint = None if control_url else leader_hint(settings, min(timeout, 10.0))
    click.echo(f"Name:        {name}")
    if spec:
        res = spec["resources"]
        click.echo(f"Version:     {spec['version']}   Priority: {spec['priority_level']}   Type: {spec['service_type']}   Backend: {spec['backend']}")
        click.echo(f"Resources:   gpuMemoryMb={res['gpu_memory_mb']} gpus={res['gpus']} cpu={res['cpu']:g} memoryMb={res['memory_mb']}")
        click.echo(f"Replicas:    min {spec['min_replicas']}, max {spec['max_replicas']}")
    click.echo(f"Phase:       {model.get('phase')}" + (f" ({model['reason']})" if model.get("reason") else "")
               + (" (last published)" if hint else ""))
    if hint:
        click.echo(f"Control:     {hint}")
    click.echo(f"Ready:       {model.get('ready_replicas', 0)}/{model.get('desired_replicas', 0)}")
    for line in _autoscale_lines(model.get("autoscale")):
        click.echo(line)
    click.echo("Replicas:")
    now_ms = time.time() * 1000
    for r in model.get("replicas") or ():
        where = f"{r['node']}" + (f" gpu {','.join(map(str, r['gpu_indices']))}" if r["gpu_indices"] else "") if r["node"] else "-"
        click.echo(f"  {r['replica_id']:<24} {r['state']:<14} {where:<20} {r['reason'] or ''}".rstrip())
        if r.get("other_version"):
            click.echo(f"    rollout: also serves {r['other_version']} (in a process of its own)")
        for c in r.get("cooldowns") or ():
            left = max(0.0, (c["until_ms"] - now_ms) / 1000)
            click.echo(f"    cool-down: kept off {c['node']} for {left:.0f}s more: {c['reason']} "
                       f"(`sie replica reset {r['replica_id']}` ends it)")
    if not control_url and spec_obj is not None:
        _describe_data_path(settings, spec_obj)
    click.echo("Events:")
    for line in event_lines(events or ()):
        click.echo(line)


def event_lines(events: Iterable[dict[str, Any]]) -> list[str]:
    """``describe``'s Events: one line per event row (``event_rows``), naming its replica unless the detail does
    (two replicas with the same reason are two lines, which would otherwise read as one event said twice)."""
    out = []
    for e in events:
        stamp = time.strftime("%H:%M:%S", time.localtime(e["ts_ms"] / 1000))
        repeated = f" (x{e['count']}, first at {time.strftime('%H:%M:%S', time.localtime(e['first_ts_ms'] / 1000))})" \
            if e.get("count", 1) > 1 else ""
        who = f"{e['replica_id']}: " if e.get("replica_id") and e["replica_id"] not in e["detail"] else ""
        out.append(f"  {stamp}  {e['kind']:<14} {who}{e['detail']}{repeated}")
    return out or ["  (none recent)"]


def _autoscale_lines(auto: dict[str, Any] | None) -> list[str]:
    """The autoscaler's decision (docs/elasticity.md), and the first request's latency after a wake from zero."""
    if not auto:
        return []
    lines = [f"Autoscale:   {auto['action']}: {auto['reason']}"]
    if auto.get("woke_at_ms"):
        woke = time.strftime("%H:%M:%S", time.localtime(auto["woke_at_ms"] / 1000))
        first = auto.get("first_result_ms")
        lines.append(f"From zero:   woke at {woke}; first result "
                     + (f"{first / 1000:.1f}s after waking (cold first request)" if first is not None else "not yet"))
    return lines


command = describe
commands = (describe,)
