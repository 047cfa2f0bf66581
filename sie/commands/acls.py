"""``sie acls plan|apply|revoke``: the least-privilege Kafka ACLs of each SIE role (``sie.kernel.acls``).

``plan`` prints the bindings and needs no Kafka; ``apply``/``revoke`` create/delete them through the
admin client, so they run with a principal allowed to change ACLs (a super user, e.g. ``admin`` on
``sie kafka up --secure``).  Names come from the cluster prefix (``SIE_TOPIC_PREFIX``) and, for a
model whose spec overrides its topics or group, from ``-f SPEC``.
"""

from __future__ import annotations

from pathlib import Path

import click

from sie.kernel.acls import ROLES
from sie.kernel.settings import Settings


def _options(fn):  # noqa: ANN001, ANN202 - click decorator stack
    for option in reversed([
        click.option("--role", type=click.Choice(ROLES), required=True, help="The SIE component the principal runs."),
        click.option("--principal", required=True, help="User name (User:NAME) or Type:name of the role's principal."),
        click.option("--model", "models", multiple=True, help="Model name(s) in scope (default topics/group)."),
        click.option("-f", "--spec", "specs", multiple=True, type=click.Path(dir_okay=False, path_type=Path),
                     help="Spec file(s) of the models in scope (their own topics/group)."),
        click.option("--node", "nodes", multiple=True, help="agent: node name(s) (default: every node)."),
        click.option("--connector", default=None, help="cdc: connector name."),
        click.option("--source-topic", "source_topics", multiple=True, help="cdc: topic(s) the connector reads."),
        click.option("--job", default=None, help="backfill: job id (default: every job)."),
    ]):
        fn = option(fn)
    return fn


def _plan(settings: Settings, role: str, principal: str, models: tuple[str, ...], specs: tuple[Path, ...],
          nodes: tuple[str, ...], connector: str | None, source_topics: tuple[str, ...], job: str | None):  # noqa: ANN202
    from sie.kernel.acls import ModelScope, plan
    from sie.schemas.spec import load

    names = settings.names
    scopes = [ModelScope.default(names, m) for m in models]
    for path in specs:
        scopes.extend(ModelScope.of_spec(s) for s in load(path, many=True, topic_prefix=settings.topic_prefix))
    return plan(names, role, principal, models=scopes, nodes=nodes, connector=connector, source_topics=source_topics,
                job=job)


@click.group("acls")
def command() -> None:
    """Least-privilege Kafka ACLs per SIE role (scorer, agent, control, cdc, backfill, producer, consumer)."""


@command.command("plan")
@_options
@click.pass_obj
def plan_cmd(settings: Settings, role: str, principal: str, **scope) -> None:  # noqa: ANN003
    """Print the ACL bindings of a role (no Kafka needed)."""
    from sie.kernel.acls import render

    click.echo(render(_plan(settings, role, principal, **scope)))


@command.command("apply")
@_options
@click.option("--timeout", type=float, default=30.0, show_default=True)
@click.pass_obj
def apply_cmd(settings: Settings, role: str, principal: str, timeout: float, **scope) -> None:  # noqa: ANN003
    """Create the bindings of a role (idempotent); run as a principal allowed to alter ACLs."""
    from sie.kernel.acls import apply, render
    from sie.kernel.admin import admin_client

    rules = _plan(settings, role, principal, **scope)
    click.echo(render(rules))
    count = apply(admin_client(settings), rules, timeout=timeout)
    click.echo(f"applied {count} ACL binding(s) for {rules[0].principal} ({role}) on {settings.bootstrap_servers}")


@command.command("revoke")
@_options
@click.option("--timeout", type=float, default=30.0, show_default=True)
@click.pass_obj
def revoke_cmd(settings: Settings, role: str, principal: str, timeout: float, **scope) -> None:  # noqa: ANN003
    """Delete exactly the bindings ``plan`` prints."""
    from sie.kernel.acls import revoke
    from sie.kernel.admin import admin_client

    rules = _plan(settings, role, principal, **scope)
    click.echo(f"deleted {revoke(admin_client(settings), rules, timeout=timeout)} ACL binding(s)")
