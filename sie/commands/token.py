"""``sie token create|list|revoke``: the control API's bearer tokens (docs/security.md).

Tokens live hashed in ``SIE_API_TOKENS_FILE`` (default ``<cache_dir>/control/api-tokens.json``, mode
0600) on the control plane's machine; a running control plane picks up changes within a second.
``create`` prints the new token once: it is not stored anywhere in clear.
"""

from __future__ import annotations

import time

import click

from sie.kernel.settings import API_ROLES, Settings


@click.group("token")
def command() -> None:
    """Manage the control API's bearer tokens (roles: viewer = read, operator = apply/delete)."""


@command.command("create")
@click.option("--name", required=True, help="Who or what holds the token (shown in audit events).")
@click.option("--role", type=click.Choice(API_ROLES), default="viewer", show_default=True)
@click.pass_obj
def create(settings: Settings, name: str, role: str) -> None:
    """Create a token; print it once (store it in a secret manager or SIE_API_TOKEN)."""
    from sie.control.api.auth import add_token

    token = add_token(settings.api_tokens_file, name, role)
    click.echo(f"created {role} token {name!r} in {settings.api_tokens_file} (only its hash is stored):", err=True)
    click.echo(token)


@command.command("list")
@click.pass_obj
def list_tokens(settings: Settings) -> None:
    """Names, roles and creation times of the tokens (never the tokens or their hashes)."""
    from sie.control.api.auth import read_token_entries

    entries = [*settings.api_tokens, *read_token_entries(settings.api_tokens_file)]
    if not entries:
        click.echo(f"(no tokens: {settings.api_tokens_file} is empty; `sie control` creates an operator token at start)")
    for e in entries:
        created = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.created_ms / 1000)) if e.created_ms else "-"
        click.echo(f"{e.name:<24} {e.role:<9} {created}")


@command.command("revoke")
@click.argument("name")
@click.pass_obj
def revoke(settings: Settings, name: str) -> None:
    """Remove a token from the tokens file (a running control plane refuses it within a second)."""
    from sie.control.api.auth import revoke_token
    from sie.kernel.errors import SieError

    if not revoke_token(settings.api_tokens_file, name):
        raise SieError(f"no token named {name!r} in {settings.api_tokens_file} (sie token list)")
    click.echo(f"revoked {name}")
