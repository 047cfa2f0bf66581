"""`sie demo`: run SIE end to end on a local Kafka (what ./quickstart.sh runs)."""

from __future__ import annotations

import click

from sie.kernel.settings import Settings


@click.command("demo")
@click.option("--requests", "requests", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="Scoring requests to send to the fraud model.")
@click.option("--http-port", type=int, default=8470, show_default=True, help="Control plane HTTP port.")
@click.option("--keep-models", is_flag=True,
              help="Leave the demo's models applied at the end (by default it deletes the ones it applied).")
@click.pass_obj
def command(settings: Settings, requests: int, http_port: int, keep_models: bool) -> None:
    """Kafka up, the article's specs applied, a control plane and two agents running two models,
    10,000 requests scored exactly once, and the cluster as an operator sees it."""
    from sie.demo import Demo

    Demo(settings, click.echo, requests=requests, http_port=http_port, keep_models=keep_models).run()
