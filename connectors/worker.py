"""A CDC connector's replica process: the exactly-once CDC stage, run by a node agent.

    python -m sie.connectors.worker --spec-file CONNECTOR.json --replica-id cdc:orders-0 --status-fd 5

The control plane assigns a connector applied through its API (``POST /v1/connectors``) like a model's
replica; the agent starts this process for it (``sie.workers.agent.launch``) and supervises it with the
same status protocol as a scorer worker (``sie.schemas.worker_status``): ``loading``, ``ready`` once the
stage is subscribed, ``progress`` with the source records committed, ``draining`` on SIGTERM, ``stopped``
after a clean exit, ``error`` before exiting 1.

The spec file holds the connector spec, the target model's input field types and request topic (the
control plane resolved them: this process reads no specs topic).  The stage instance is the replica id
made fit for a transactional id (``cdc:orders-0`` -> ``cdc-orders-0``): stable, so a replica restarted
or moved fences its predecessor.  SIGTERM (a pause, a delete, a move) lets the stage commit its batch and
leave its group: the committed offsets are exactly where it resumes.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from sie.schemas.worker_status import StatusWriter

log = logging.getLogger("sie.connector")


def instance_of(replica_id: str) -> str:
    """The stage instance of a replica id (``:`` cannot be part of a transactional id)."""
    return replica_id.replace(":", "-")


def run(args: argparse.Namespace, status: StatusWriter) -> int:
    from sie.connectors.cdc_stage import CdcStage, CdcStageConfig
    from sie.kernel.admin import ensure_model_topics, ensure_topics
    from sie.kernel.settings import Settings
    from sie.kernel.topics import TopicSpec
    from sie.schemas.connector_spec import is_connector_doc, parse_connector_spec

    stop = threading.Event()

    def _on_term(signum: int, _frame: Any) -> None:
        status.emit("draining", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)

    settings = Settings()
    doc = json.loads(Path(args.spec_file).read_text(encoding="utf-8"))
    if not is_connector_doc(doc):
        raise ValueError(f"{args.spec_file}: not a connector replica document (no kind: CdcConnector)")
    spec = parse_connector_spec(doc["connector"], source=f"replica {args.replica_id}")
    status.emit("loading", pid=os.getpid(), connector=spec.name, replica=args.replica_id)
    config = CdcStageConfig(settings=settings, connector=spec, instance=instance_of(args.replica_id),
                            field_types=doc.get("field_types"), request_topic=doc.get("request_topic"),
                            log_interval_s=max(5.0, args.progress_interval))
    stage = CdcStage(config)
    ensure_model_topics(settings, [stage.request_topic], settings.request_partitions)
    ensure_topics(settings, [TopicSpec(config.dlq, settings.request_partitions, False,
                                       f"dead letters of CDC connector {spec.name}")])
    progress_stop = threading.Event()

    def progress() -> None:
        while not progress_stop.wait(args.progress_interval):
            status.emit("progress", records=stage.summary().records)

    ticker = threading.Thread(target=progress, name="progress", daemon=True)

    def on_ready() -> None:
        status.emit("ready", source=spec.source_topic, requests=stage.request_topic,
                    transactional_id=config.transactional_id)
        ticker.start()

    try:
        summary = stage.run(stop, on_ready=on_ready)
    finally:
        progress_stop.set()
    log.info("connector %s stopped: %s", spec.name, summary.line())
    status.emit("stopped", records=summary.records)
    return 0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sie.connectors.worker", description=__doc__.splitlines()[0])
    parser.add_argument("--spec-file", type=Path, required=True, help="connector replica document (JSON)")
    parser.add_argument("--replica-id", required=True, help="stable replica id, e.g. cdc:orders-0")
    parser.add_argument("--status-fd", type=int, default=None, help="fd of the status pipe to the agent")
    parser.add_argument("--progress-interval", type=float, default=1.0, help="seconds between progress lines")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stream = os.fdopen(args.status_fd, "w", buffering=1, encoding="utf-8") if args.status_fd is not None else None
    status = StatusWriter(stream)
    try:
        return run(args, status)
    except Exception as exc:  # a bad spec, a missing ACL, a fatal producer: report, exit 1 (the agent restarts it)
        log.exception("connector replica %s failed", args.replica_id)
        status.emit("error", detail=str(exc) or type(exc).__name__)
        return 1


if __name__ == "__main__":
    sys.exit(main())
