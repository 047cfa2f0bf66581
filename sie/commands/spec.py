"""`sie validate`, `sie apply`, `sie get models`, `sie delete model`: ModelService specs on the cluster.

``validate`` needs no Kafka.  ``apply`` validates, uploads the spec's artifact and its own Python package
to the cluster (named by sha256, ``sie.commands._artifacts``; ``--no-upload`` keeps this machine's paths),
refuses a new version whose
I/O schema breaks the applied one (the control plane's ``POST /v1/models``
refuses it too; ``--allow-breaking`` overrides), then publishes the spec on the
compacted specs topic and waits for the broker's acknowledgement.  Applying
the same spec twice changes nothing.

With ``--control-url`` (``SIE_CONTROL_URL``) ``apply``, ``get models`` and ``delete model`` go through
a control plane's HTTP API instead of Kafka, with the bearer token of ``SIE_API_TOKEN``: the control
plane then checks the caller's role and writes an audit event.  Without it they need Kafka
credentials that may write the specs topic (docs/security.md, role ``control``).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from sie.kernel.errors import SieError, SpecError
from sie.kernel.settings import Settings

_FILE = click.Path(dir_okay=False, path_type=Path)
_URL = click.option("--control-url", default=None, envvar="SIE_CONTROL_URL",
                    help="Go through this control plane's HTTP API instead of Kafka (token: SIE_API_TOKEN).")


def _load_by_file(settings: Settings, files: tuple[Path, ...]):
    """(file, its specs) for every file, checked against this node's spec policy; all files' problems in one
    SpecError."""
    from sie.schemas.spec import InvalidSpec
    from sie.schemas.spec_policy import load_local_specs

    loaded, failures = [], []
    for path in files:
        try:
            loaded.append((path, load_local_specs(path, settings)))
        except InvalidSpec as exc:
            failures.append(str(exc))
    if failures:
        raise SpecError("\n".join(failures))
    return loaded


def _load_all(settings: Settings, files: tuple[Path, ...]):
    return [spec for _path, specs in _load_by_file(settings, files) for spec in specs]


def _print_ok(spec, verb: str = "ok") -> None:
    click.echo(f"{verb}: {spec.name} {spec.version} ({spec.backend.type})")
    for warning in spec.warnings:
        click.echo(f"  warning: {warning}")


@click.command("validate")
@click.option("-f", "--file", "files", type=_FILE, multiple=True, required=True, help="Spec file (repeatable).")
@click.pass_obj
def validate(settings: Settings, files: tuple[Path, ...]) -> None:
    """Check ModelService spec files; print each model and what SIE cannot honour (warnings)."""
    for spec in _load_all(settings, files):
        _print_ok(spec)


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
    from sie.schemas.spec_store import ensure_specs_topic, publish_spec, read_specs, specs_topic

    loaded = _load_by_file(settings, files)
    if control_url:
        import yaml

        from sie.commands._api import ApiRefused, ControlApi
        from sie.schemas.spec import read_yaml_documents

        if allow_breaking:
            raise SieError("--allow-breaking is not offered through the API; apply without --control-url")
        api = ControlApi(settings, control_url, timeout=timeout)
        for path, specs in loaded:
            docs = read_yaml_documents(path.read_text(encoding="utf-8"), str(path))  # the order load_specs read
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
    ensure_specs_topic(settings)
    applied = read_specs(settings, timeout=timeout)
    uploader = KafkaUploader(settings, timeout) if upload else None
    for path, specs in loaded:
        for spec in specs:
            if uploader is not None:
                spec = for_cluster(spec, path, settings, uploader)
            current = applied.get(spec.name)
            if current is not None and _comparable(current.to_document()) == _comparable(spec.to_document()):
                _print_ok(spec, "unchanged")
                continue
            if current is not None and current.version != spec.version:
                breaks = check_spec_compatibility(current, spec)
                if breaks and not allow_breaking:
                    lines = "\n".join(f"  {b}" for b in breaks)
                    raise SpecError(
                        f"{spec.name} {spec.version}: schema_incompatible with applied {current.version} "
                        f"(a rolling update would break clients; --allow-breaking to force):\n{lines}"
                    )
            publish_spec(settings, spec, timeout=timeout, ensure_topic=False)
            applied[spec.name] = spec  # a later file in this run compares against what we just published
            _print_ok(spec, "applied" if current is None else "configured")
            click.echo(f"  -> {specs_topic(settings)} (requests: {spec.topics.requests})")


@click.group("get")
def get() -> None:
    """Show what is applied on the cluster."""


@get.command("models")
@click.option("-o", "--output", type=click.Choice(["table", "json"]), default="table", show_default=True)
@click.option("--timeout", type=float, default=30.0, show_default=True)
@_URL
@click.pass_obj
def get_models(settings: Settings, output: str, timeout: float, control_url: str | None) -> None:
    """Applied models: the latest spec per model on the specs topic."""
    from sie.schemas.spec_store import read_spec_snapshot

    if control_url:
        from sie.commands._api import ControlApi

        models = ControlApi(settings, control_url, timeout=timeout).get("/v1/models")["models"]
        if output == "json":
            click.echo(json.dumps(models, indent=2))
            return
        table = [("NAME", "VERSION", "BACKEND", "PRIORITY", "PHASE", "READY")]
        for m in models:
            spec = m.get("spec") or {}
            table.append((m["name"], spec.get("version", "-"), spec.get("backend", "-"), spec.get("priority_level", "-"),
                          m.get("phase", "-"), f"{m.get('ready_replicas', 0)}/{m.get('desired_replicas', 0)}"))
        widths = [max(len(str(r[i])) for r in table) for i in range(len(table[0]))]
        for row in table:
            click.echo("  ".join(str(cell).ljust(w) for cell, w in zip(row, widths)).rstrip())
        if not models:
            click.echo("(no models applied)")
        return

    snapshot = read_spec_snapshot(settings, timeout=timeout)
    for problem in snapshot.problems:
        click.echo(f"warning: {problem}", err=True)
    specs = [snapshot.specs[n] for n in sorted(snapshot.specs)]
    if output == "json":
        click.echo(json.dumps([s.to_document() for s in specs], indent=2))
        return
    rows = [("NAME", "VERSION", "BACKEND", "PRIORITY", "GPU-MEM", "REPLICAS")]
    for s in specs:
        gpu = f"{s.resources.gpu_memory_mb}MB" + (f" x{s.resources.gpus}" if s.resources.gpus else "")
        rows.append((s.name, s.version, s.backend.type, s.priority_level, gpu,
                     f"{s.sla.min_replicas}-{s.sla.max_replicas}"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    if not specs:
        click.echo("(no models applied)")


@click.group("delete")
def delete() -> None:
    """Remove things from the cluster."""


@delete.command("model")
@click.argument("name")
@click.option("--timeout", type=float, default=30.0, show_default=True)
@_URL
@click.pass_obj
def delete_model(settings: Settings, name: str, timeout: float, control_url: str | None) -> None:
    """Delete an applied model (a deleted record, then a tombstone, on the specs topic)."""
    from sie.schemas.spec_store import delete_spec, read_specs

    if control_url:
        from urllib.parse import quote

        from sie.commands._api import ControlApi

        ControlApi(settings, control_url, timeout=timeout).request("DELETE", f"/v1/models/{quote(name, safe='')}")
        click.echo(f"deleted: {name} via {control_url}")
        return

    applied = read_specs(settings, timeout=timeout)
    if name not in applied:
        known = ", ".join(sorted(applied)) or "none"
        raise SieError(f"model {name!r} is not applied on {settings.bootstrap_servers} (applied: {known})")
    delete_spec(settings, applied[name], timeout=timeout)
    click.echo(f"deleted: {name} {applied[name].version}")


command = validate
commands = (validate, apply, get, delete)
