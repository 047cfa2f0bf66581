"""`sie score -f SPEC`: run one exactly-once scorer for a model in the foreground.

The command only wires things together (settings, spec, topics, backend,
signals); the scorer itself is the library function
``sie.streams.scorer.rollout.run_rollout_scorer`` (``run_scorer`` that follows the model's rollouts), which the node agent runs too.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click

from sie.commands._runtime import configure_logging, require_kafka, stop_on_signals
from sie.kernel.settings import Settings


class _ScorerDefault(click.Option):
    """An option whose default is ``ScorerConfig``'s field of the same name, read when ``sie score`` runs or shows its
    help: not when ``sie --help`` lists the commands (the scorer's package imports numpy, Kafka's client and the
    metrics, a third of a second of start-up for every ``sie`` command that lists or loads this module)."""

    def __init__(self, *args: Any, field: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._field = field

    def get_default(self, ctx: click.Context, call: bool = True) -> Any:
        from sie.streams.scorer.config import ScorerConfig

        return getattr(ScorerConfig, self._field)


@click.command("score")
@click.option("-f", "--file", "spec_file", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="ModelService spec (YAML or JSON).")
@click.option("--max-batch", type=click.IntRange(min=1), cls=_ScorerDefault, field="max_batch", show_default=True,
              help="Records per batch (= per transaction and per backend.infer call).")
@click.option("--max-wait-ms", type=click.IntRange(min=0), cls=_ScorerDefault, field="max_wait_ms", show_default=True,
              help="How long a started batch may wait to fill up (0: adaptive, what is already fetched).")
@click.option("--pipelined/--serial", cls=_ScorerDefault, field="pipelined", show_default=True,
              help="Commit a batch while the next one is scored (--serial: one batch at a time).")
@click.option("--metrics-port", type=click.IntRange(min=0, max=65535),
              help="Serve Prometheus /metrics here (0 = any free port; the ready line prints the one bound).")
@click.option("--instance", help="Stable, unique replica name: transactional.id = sie.scorer.<model>.<instance>. "
                                 "Default: <hostname>-<replica>.")
@click.option("--replica", type=click.IntRange(min=0), default=0, show_default=True,
              help="Replica index used in the default --instance.")
@click.option("--bootstrap-servers", help="Kafka bootstrap servers (overrides SIE_BOOTSTRAP_SERVERS).")
@click.option("--partitions", type=click.IntRange(min=1), help="Partitions of model topics created if missing "
                                                                "(default: SIE_REQUEST_PARTITIONS).")
@click.option("--session-timeout-ms", type=click.IntRange(min=1000), default=10_000, show_default=True,
              help="Consumer group session timeout: how fast a dead scorer's partitions move. Also its "
                   "transaction timeout (at least 10 s) and how long it may commit nothing before it gives its "
                   "partitions to the other replicas.")
@click.option("--expired-to", type=click.Choice(["result", "dead_letter"]), default="result", show_default=True,
              help="Where requests older than sla.max_queue_time_ms go.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
@click.pass_obj
def command(settings: Settings, spec_file: Path, max_batch: int, max_wait_ms: int, pipelined: bool,
            metrics_port: int | None,
            instance: str | None, replica: int, bootstrap_servers: str | None, partitions: int | None,
            session_timeout_ms: int, expired_to: str, log_level: str) -> None:
    """Score a model's request topic exactly once until SIGTERM/SIGINT.

    An sglang spec whose backend config names running servers (``endpoints`` or ``server_url``) is served
    through the LLM window (up to the servers' concurrency in flight, short transactions; docs/llm.md).

    Ensures the model's topics exist, loads the backend, prints `ready ...`
    once subscribed, finishes and commits the current batch on SIGTERM, and
    prints a summary line on exit.
    """
    from sie.kernel.admin import ensure_model_topics
    from sie.schemas.spec import load
    from sie.schemas.spec_policy import SpecPolicy
    from sie.streams.scorer import ScorerConfig, default_instance
    from sie.streams.scorer.rollout import run_rollout_scorer
    from sie.workers.backends import backend_config_from_spec, create_backend

    settings = settings.with_overrides(bootstrap_servers=bootstrap_servers)
    policy = SpecPolicy.from_settings(settings, extra_roots=[spec_file.resolve().parent])
    spec = load(spec_file, policy)
    require_kafka(settings)  # one line within seconds if Kafka does not answer (logs start after it)
    configure_logging(log_level)
    topics = spec.topics
    from sie.streams.llm.config import deferred_topic

    ensure_model_topics(settings, [topics.requests, topics.results, topics.dead_letters,
                                   deferred_topic(spec, settings.names)],
                        partitions or settings.request_partitions)
    config = ScorerConfig(
        settings=settings, spec=spec, instance=instance or default_instance(replica), max_batch=max_batch,
        max_wait_ms=max_wait_ms, pipelined=pipelined, metrics_port=metrics_port,
        session_timeout_ms=session_timeout_ms,
        expired_to=expired_to,  # type: ignore[arg-type]
    )

    def load_backend(model_spec):
        backend = create_backend(backend_config_from_spec(policy.enforce(model_spec), policy))
        backend.load()
        return backend

    stop = stop_on_signals()

    def ready(scorer) -> None:
        click.echo(f"ready: scoring {spec.model_id} from {topics.requests} -> {topics.results} "
                   f"(dlq {topics.dead_letters}) as {config.transactional_id}"
                   + (f", metrics on {settings.metrics_bind}:{scorer.metrics.port}" if metrics_port is not None else ""))
        sys.stdout.flush()

    started = time.monotonic()
    from sie.streams.llm.config import serves_through_window

    # the one rule the agent's worker asks too; `sie score` launches no server, so: the servers the spec names
    if serves_through_window(spec):  # an LLM served by running servers: the continuous in-flight window (docs/llm.md)
        from sie.streams.llm.stage import run_llm_scorer

        policy.enforce(spec)
        summary = run_llm_scorer(config, stop, on_ready=ready)
    else:  # follows the model's rollouts: the other version in a process of its own, prepared as an agent would
        import tempfile

        from sie.workers.agent.artifacts import ArtifactFetcher
        from sie.workers.versions import ProcessVersions, SelfPrepared

        with tempfile.TemporaryDirectory(prefix="sie-score-versions-") as folder:
            fetcher = ArtifactFetcher(settings, policy)
            versions = ProcessVersions(SelfPrepared(Path(folder), policy, fetcher), f"scorer {config.instance}",
                                       log_dir=Path(folder), call_timeout_s=settings.companion_call_timeout_s,
                                       load_timeout_s=settings.companion_load_timeout_s)
            try:
                summary = run_rollout_scorer(config, load_backend, stop, on_ready=ready, versions=versions)
            finally:
                fetcher.close()
    click.echo(f"stopped after {time.monotonic() - started:.1f}s: {summary.line()}")
