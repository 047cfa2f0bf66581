"""``python -m sie.workers.multimodel --state-dir DIR``: a multi-model worker process (sie.workers.multimodel.host).

It hosts the models DIR/models.json names (rewritten atomically by the agent or an operator, read on
every tick) and reports in DIR/health.json; SIGTERM drains every model (each commits its batch in flight)
and exits 0.  Settings (Kafka, spec policy, ``SIE_SHARED_PROCESS_THREADS``, ``SIE_SHARED_LANE_HANG_S``) come
from SIE_* environment variables, read once here.
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m sie.workers.multimodel", description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True, help="where models.json is read and health.json written")
    parser.add_argument("--metrics-port", type=int, default=None, help="/metrics of every hosted model (0: any free port)")
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between reconcile/watchdog ticks")
    parser.add_argument("--hang-s", type=float, default=None, help="inference deadline (default SIE_SHARED_LANE_HANG_S)")
    parser.add_argument("--log-level", default="info")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from sie.kernel.settings import Settings
    from sie.workers.multimodel.host import Host

    stop = threading.Event()

    def _on_term(_signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    host = Host(Settings(), args.state_dir, hang_s=args.hang_s)
    if args.metrics_port is not None:
        host.serve_metrics(args.metrics_port)
    host.run(stop, interval_s=args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())
