"""`sie validate`, `sie apply`, `sie get models`, `sie delete model`: ModelService specs on the cluster.

``validate`` needs no Kafka (``--load`` runs the model once on the CPU).  ``apply`` validates, uploads the
spec's artifact and its own Python package to the cluster (named by sha256, ``sie.commands._artifacts``;
``--no-upload`` keeps this machine's paths), refuses a new version whose
I/O schema breaks the applied one (the control plane's ``POST /v1/models``
refuses it too; ``--allow-breaking`` overrides), then publishes the spec on the
compacted specs topic and waits for the broker's acknowledgement.  Applying
the same spec twice changes nothing, except that a replica of it in cool-down (FAILED on a node) is
placed again: the spec is re-published, which ends cool-downs that began before it.

With ``--control-url`` (``SIE_CONTROL_URL``) ``apply``, ``get models`` and ``delete model`` go through
a control plane's HTTP API instead of Kafka, with the bearer token of ``SIE_API_TOKEN``: the control
plane then checks the caller's role and writes an audit event.  Without it they need Kafka
credentials that may write the specs topic (docs/security.md, role ``control``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from sie.commands._runtime import require_kafka
from sie.control.api.listing import MAX_LIMIT, ModelPhase
from sie.kernel.errors import SieError, SpecError
from sie.kernel.settings import Settings

_FILE = click.Path(dir_okay=False, path_type=Path)
_URL = click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
                    help="Go through this control plane's HTTP API instead of Kafka (token: SIE_API_TOKEN).")


def _load_by_file(settings: Settings, files: tuple[Path, ...]):
    """(file, its specs) for every file, checked against this node's spec policy; all files' problems in one
    SpecError."""
    from sie.schemas.spec import InvalidSpec, load

    loaded, failures = [], []
    for path in files:
        try:
            loaded.append((path, load(path, settings, many=True)))
        except InvalidSpec as exc:
            failures.append(str(exc))
    if failures:
        raise SpecError("\n".join(failures))
    return loaded


def _print_ok(spec, verb: str = "ok") -> None:
    click.echo(f"{verb}: {spec.name} {spec.version} ({spec.backend.type})")
    for warning in spec.warnings:
        click.echo(f"  warning: {warning}")


@click.command("validate")
@click.option("-f", "--file", "files", type=_FILE, multiple=True, required=True, help="Spec file (repeatable).")
@click.option("--load", is_flag=True,
              help="Also load the artifact on the CPU, score exampleInput and check the output against "
                   "outputSchema (shape, types, ranges), as a worker would. Runs the model's code.")
@click.pass_obj
def validate(settings: Settings, files: tuple[Path, ...], load: bool) -> None:
    """Check ModelService spec files; print each model and what SIE cannot honour (warnings).

    Without --load only the document is checked (no Kafka, no model code); with it, each model is loaded
    and run once, and every problem is listed (exit 1).
    """
    from sie.schemas.spec_policy import SpecPolicy

    failures: list[str] = []
    for path, spec in ((path, spec) for path, specs in _load_by_file(settings, files) for spec in specs):
        if not load:
            _print_ok(spec)
            continue
        from sie.workers.load_check import load_check

        # the policy the document was just checked under (the node's settings + the spec's folder), which
        # is the one a worker of this node loads it under (SIE_ALLOWED_MODULES, SIE_MODEL_ROOTS)
        report = load_check(spec, SpecPolicy.from_settings(settings, extra_roots=[path.resolve().parent]))
        # a spec is "ok" only once everything asked of it passed: `ok:` then `error:` for one spec read as both
        _print_ok(spec, "ok" if report.skipped or report.ok else "failed")
        for note in report.notes:
            click.echo(f"  note: {note}")
        if report.skipped:
            click.echo(f"  load: skipped: {report.skipped}")
        elif report.ok:
            shown = json.dumps(report.outputs, default=str)
            click.echo(f"  load: ok on cpu in {report.seconds:.2f}s; exampleInput -> {shown[:300]}")
        else:
            click.echo(f"  load: {len(report.problems)} problem(s), below")
            failures += [f"{spec.model_id}: {problem}" for problem in report.problems]
    if failures:
        raise SpecError("\n".join(failures))


def _comparable(doc: dict) -> dict:
    return {k: v for k, v in doc.items() if k not in ("source", "warnings")}


@click.command("apply")
@click.option("-f", "--file", "files", type=_FILE, multiple=True, required=True, help="Spec file (repeatable).")
@click.option("--allow-breaking", is_flag=True, help="Publish even if the new version's schema breaks the applied one.")
@click.option("--timeout", type=float, default=30.0, show_default=True, help="Seconds to wait for Kafka.")
@click.option("--upload/--no-upload", default=True, show_default=True,
              help="Upload the spec's artifact and its own Python package (found next to the spec) to the "
                   "cluster, named by sha256, so every node can fetch them. --no-upload publishes this "
                   "machine's paths (one machine, or a filesystem every node shares).")
@_URL
@click.pass_obj
def apply(settings: Settings, files: tuple[Path, ...], allow_breaking: bool, timeout: float, upload: bool,
          control_url: str | None) -> None:
    """Validate specs, upload what they need, and publish them on the cluster's specs topic (key = model name)."""
    from sie.commands._artifacts import ApiUploader, KafkaUploader, document_for_api, for_cluster
    from sie.schemas.compat import check_spec_compatibility
    from sie.schemas.spec_store import AckedWriter, ensure_specs_topic, publish_spec, read_specs, specs_topic

    loaded = _load_by_file(settings, files)
    if upload:  # every file that would leave this machine is checked before anything is uploaded or published
        from sie.commands._artifacts import upload_problems

        refused = [p for path, specs in loaded for spec in specs for p in upload_problems(spec, path, settings)]
        if refused:
            raise SpecError("\n".join(refused))
    if control_url:
        import yaml

        from sie.commands._api import ApiRefused, ControlApi
        from sie.schemas.spec import read_yaml_documents

        if allow_breaking:
            raise SieError("--allow-breaking is not offered through the API; apply without --control-url")
        api = ControlApi(settings, control_url, timeout=timeout)
        for path, specs in loaded:
            docs = read_yaml_documents(path.read_text(encoding="utf-8"), str(path))  # the order load read
            for doc, spec in zip(docs, specs):
                if upload:
                    spec = for_cluster(spec, path, settings, ApiUploader(api))
                text = yaml.safe_dump(document_for_api(doc, spec), sort_keys=False)
                try:
                    answer = api.request("POST", "/v1/models", text)
                except ApiRefused as exc:
                    body = exc.body if isinstance(exc.body, dict) else {}
                    details = [f"  {e.get('field')}: {e.get('reason')}" for e in body.get("errors", [])]
                    raise SpecError("\n".join([str(exc), *details])) from None
                click.echo(f"applied: {answer['name']} {answer['version']} via {control_url}")
                for warning in answer.get("warnings", []):
                    click.echo(f"  warning: {warning}")
        return
    require_kafka(settings)
    ensure_specs_topic(settings)
    applied = read_specs(settings, timeout=timeout)
    uploader = KafkaUploader(settings, timeout) if upload else None
    cooling: dict[str, list[str]] | None = None
    writer = AckedWriter(settings, settings.names.cli_client_id("apply"), timeout_s=timeout)  # one producer for all
    try:
        for path, specs in loaded:
            for spec in specs:
                if uploader is not None:
                    spec = for_cluster(spec, path, settings, uploader)
                current = applied.get(spec.name)
                if current is not None and _comparable(current.to_document()) == _comparable(spec.to_document()):
                    if cooling is None:
                        cooling = _cooling_replicas(settings, timeout)
                    if not cooling.get(spec.name):
                        _print_ok(spec, "unchanged")
                        continue
                    # the same spec again, but a replica of it is in cool-down: re-publishing it is the operator's
                    # "I fixed it" (the control plane ends cool-downs that began before a spec was applied)
                    publish_spec(settings, spec, timeout=timeout, ensure_topic=False, writer=writer)
                    _print_ok(spec, "re-applied")
                    click.echo(f"  cool-down ended for {', '.join(cooling[spec.name])}: placed again on the next pass")
                    continue
                if current is not None and current.version != spec.version:
                    breaks = check_spec_compatibility(current, spec)
                    if breaks and not allow_breaking:
                        lines = "\n".join(f"  {b}" for b in breaks)
                        raise SpecError(
                            f"{spec.name} {spec.version}: schema_incompatible with applied {current.version} "
                            f"(a rolling update would break clients; --allow-breaking to force):\n{lines}"
                        )
                publish_spec(settings, spec, timeout=timeout, ensure_topic=False, writer=writer)
                applied[spec.name] = spec  # a later file in this run compares against what we just published
                _print_ok(spec, "applied" if current is None else "configured")
                click.echo(f"  -> {specs_topic(settings)} (requests: {spec.topics.requests})")
    finally:
        writer.close()


def _cooling_replicas(settings: Settings, timeout: float) -> dict[str, list[str]]:
    """Model -> its replicas in a cool-down, as the leader last published (the model-status topic)."""
    from sie.commands.cluster import statuses_json

    models, _ = statuses_json(settings, None, timeout)
    return {m["name"]: [r["replica_id"] for r in m.get("replicas") or () if r.get("cooldowns")] for m in models}


@click.group("get")
def get() -> None:
    """Show what is applied on the cluster."""


#: a model's phases, the API's (``sie.control.api.listing``: no web stack)
MODEL_PHASES = [p.value for p in ModelPhase]


@get.command("models")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--timeout", type=float, default=30.0, show_default=True)
@_URL
@click.option("--model", default=None, metavar="NAME", help="Only this model.")
@click.option("--phase", type=click.Choice(MODEL_PHASES), default=None,
              help="Only the models in this phase (from Kafka: the model-status topic is read as well).")
@click.option("--limit", type=click.IntRange(1, MAX_LIMIT), default=None, metavar="N",
              help="Show one page of at most N (sorted by name); stderr says how to get the next.  "
                   "[default: everything]")
@click.option("--after", default=None, metavar="NAME", help="Start after NAME (exclusive): the name the page before "
                                                             "said to go on from.")
@click.pass_obj
def get_models(settings: Settings, output: str, timeout: float, control_url: str | None, model: str | None,
               phase: str | None, limit: int | None, after: str | None) -> None:
    """Applied models: the latest spec per model on the specs topic."""
    from sie.commands.cluster import api_page, checked_name, json_text, read_page, say_next
    from sie.commands.cluster import table as table_text
    from sie.schemas.spec_store import read_spec_snapshot

    model, after = checked_name("model", model, "model"), checked_name("model", after, "after")
    more = {"control_url": control_url, "model": model, "phase": phase,
            "output": output if output != "table" else None, "limit": limit}
    if control_url:
        answer, next_name = api_page(settings, control_url, "/v1/models", "models", "name", limit, after,
                                     {"model": model, "phase": phase}, timeout, {"model": "name"})
        models = list(answer)
        say_next("sie get models", next_name, **more)
        if output == "json":
            click.echo(json_text(models))
            return
        table = [("NAME", "VERSION", "BACKEND", "PRIORITY", "PHASE", "READY")]
        for m in models:
            spec = m.get("spec") or {}
            table.append((m["name"], spec.get("version", "-"), spec.get("backend", "-"), spec.get("priority_level", "-"),
                          m.get("phase", "-"), f"{m.get('ready_replicas', 0)}/{m.get('desired_replicas', 0)}"))
        table_text([tuple(map(str, row)) for row in table])
        if not models:
            click.echo("(no models match)" if model or phase or after else "(no models applied)")
        return

    require_kafka(settings)
    snapshot = read_spec_snapshot(settings, timeout=timeout)
    for problem in snapshot.problems:
        click.echo(f"warning: {problem}", err=True)
    applied: list[dict[str, str]] = [{"name": n} for n in sorted(snapshot.specs)]
    if phase is not None:  # the phase is the leader's: its last published status, else Pending
        from sie.commands.cluster import statuses_json

        statuses, _ = statuses_json(settings, None, timeout)
        phases = {str(m["name"]): str(m.get("phase")) for m in statuses}
        applied = [{"name": r["name"], "phase": phases.get(r["name"], "Pending")} for r in applied]
    chosen, next_name = read_page(applied, "name", limit, after, name=model, phase=phase)
    say_next("sie get models", next_name, **more)
    specs = [snapshot.specs[str(r["name"])] for r in chosen]
    if output == "json":
        click.echo(json.dumps([s.to_document() for s in specs], indent=2))
        return
    rows = [("NAME", "VERSION", "BACKEND", "PRIORITY", "GPU-MEM", "REPLICAS")]
    for s in specs:
        gpu = f"{s.resources.gpu_memory_mb}MB" + (f" x{s.resources.gpus}" if s.resources.gpus else "")
        rows.append((s.name, s.version, s.backend.type, s.priority_level, gpu,
                     f"{s.sla.min_replicas}-{s.sla.max_replicas}"))
    table_text(rows)
    if not specs:
        click.echo("(no models match)" if model or phase or after else "(no models applied)")


@click.group("delete")
def delete() -> None:
    """Remove things from the cluster."""


@delete.command("model")
@click.argument("name")
@click.option("--purge", is_flag=True, help="Also delete the model's topics (requests, results, dead letters, "
                                            "backfill) and consumer groups (scorer, redrive), after confirmation.")
@click.option("--yes", is_flag=True, help="With --purge: do not ask (needed when stdin is not a terminal).")
@click.option("--timeout", type=float, default=30.0, show_default=True)
@_URL
@click.pass_obj
def delete_model(settings: Settings, name: str, purge: bool, yes: bool, timeout: float,
                 control_url: str | None) -> None:
    """Delete an applied model (a deleted record, then a tombstone, on the specs topic).

    --purge then removes its data: the topics its spec names and its groups, once its scorers have left
    (the control plane drains them when the spec is deleted).  A model deleted earlier can be purged too:
    its default topic names are used then.
    """
    from sie.schemas.spec_store import delete_spec, read_specs

    if control_url:
        from urllib.parse import quote

        from sie.commands._api import ControlApi

        if purge:
            raise SieError("--purge deletes topics and groups with Kafka admin rights: run it without --control-url")
        ControlApi(settings, control_url, timeout=timeout).request("DELETE", f"/v1/models/{quote(name, safe='')}")
        click.echo(f"deleted: {name} via {control_url}")
        return

    require_kafka(settings)
    applied = read_specs(settings, timeout=timeout)
    if name not in applied and not purge:
        known = ", ".join(sorted(applied)) or "none"
        raise SieError(f"model {name!r} is not applied on {settings.bootstrap_servers} (applied: {known})")
    spec = applied.get(name)
    if purge:
        from sie.commands.purge import plan_purge

        plan = plan_purge(settings, name, spec, timeout)
        click.echo(plan.describe())
        if not plan.topics and not plan.groups and spec is None:
            raise SieError(f"model {name!r} is not applied and has no topics or groups left to purge")
        if not yes:
            if not sys.stdin.isatty():
                raise click.UsageError("--purge deletes data: confirm at a terminal, or pass --yes")
            click.confirm("delete these for good?", abort=True)
    if spec is not None:
        delete_spec(settings, spec, timeout=timeout)
        click.echo(f"deleted: {name} {spec.version}")
    if purge:
        from sie.commands.purge import run_purge

        for line in run_purge(settings, plan, timeout):
            click.echo(line)


command = validate
commands = (validate, apply, get, delete)
