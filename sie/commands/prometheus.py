"""``sie prometheus config``: a Prometheus configuration that scrapes an SIE cluster with SIE's rules.

Two jobs (docs/observability.md):

- ``sie-control``: each control plane's ``/metrics`` (static targets: the URLs given), with a bearer token
  read by Prometheus from a file (``--token-file``: a viewer token, ``sie token create --name prometheus
  --role viewer``), unless ``/metrics`` is public (``SIE_API_PUBLIC_PATHS``);
- ``sie``: every agent and worker, found through the control plane's ``http_sd`` endpoint
  (``/v1/prometheus/targets``, the same token), labelled ``sie_component``, ``sie_node``, ``sie_replica``,
  ``sie_model``.  These endpoints take no token, so none is sent to them.

The token itself never appears in the configuration (``credentials_file``), and the rules file is the
one installed with SIE (``sie/infra/prometheus/sie-rules.yml``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import click


def rules_file() -> Path:
    """The rules installed with SIE (package data of ``sie.infra``)."""
    from importlib.resources import files

    return Path(str(files("sie.infra") / "prometheus" / "sie-rules.yml"))


def prometheus_config(control_urls: list[str], token_file: Path | None, interval: str = "15s",
                      rules: Path | None = None) -> dict[str, Any]:
    """The configuration as a dict (``yaml.safe_dump`` writes it)."""
    if not control_urls:
        raise click.UsageError("give at least one --control-url")
    parts = [urlsplit(u) for u in control_urls]
    for url, p in zip(control_urls, parts):
        if p.scheme not in ("http", "https") or not p.netloc:
            raise click.UsageError(f"--control-url: expected http(s)://host:port (got {url!r})")
    schemes = {p.scheme for p in parts}
    if len(schemes) != 1:
        raise click.UsageError("--control-url: use one scheme (http or https) for every control plane")
    scheme = schemes.pop()

    def auth() -> dict[str, Any]:  # a fresh dict each time: YAML without anchors, each job readable alone
        return {"authorization": {"type": "Bearer", "credentials_file": str(token_file)}} if token_file else {}

    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(rules or rules_file())],
        "scrape_configs": [
            {"job_name": "sie-control", "scheme": scheme, **auth(),
             "static_configs": [{"targets": [p.netloc for p in parts], "labels": {"sie_component": "control"}}]},
            {"job_name": "sie",
             "http_sd_configs": [{"url": f"{u.rstrip('/')}/v1/prometheus/targets", "refresh_interval": interval, **auth()}
                                 for u in control_urls]},
        ],
    }


@click.group("prometheus")
def command() -> None:
    """Prometheus for an SIE cluster (docs/observability.md)."""


@command.command("config")
@click.option("--control-url", "control_urls", multiple=True, required=True,
              help="A control plane's API, e.g. http://127.0.0.1:8470 (repeat for each instance).")
@click.option("--token-file", type=click.Path(dir_okay=False, path_type=Path),
              help="File holding a viewer token Prometheus sends (omit when /metrics is public).")
@click.option("--interval", default="15s", show_default=True, help="Scrape, evaluation and discovery interval.")
def config(control_urls: tuple[str, ...], token_file: Path | None, interval: str) -> None:
    """Print a prometheus.yml that scrapes every control plane, agent and worker, with SIE's rules."""
    import yaml

    click.echo(yaml.safe_dump(prometheus_config(list(control_urls), token_file, interval), sort_keys=False), nl=False)
