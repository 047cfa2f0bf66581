"""CPU one dedicated scorer replica uses, idle and at steady request rates (issue 28.8: sizing ``resources.cpu``).

    python bench/bench_replica_cpu.py [--rates 0,200,1000] [--seconds 60]

Against the broker in SIE_BOOTSTRAP_SERVERS (default 127.0.0.1:9092).  For each model (the demo's
``fraud-scorer``, TorchScript with ``threads: 1``, and ``fraud-rules``, a python callable), one ``sie score``
process is started on its own topics; once READY, requests are produced at each rate (paced, one producer
thread) and the process's CPU time (utime + stime from /proc/<pid>/stat) and the requests its group committed are read
over ``--seconds`` after a 10 s warm-up: CPU seconds per wall second is what ``resources.cpu`` declares.
A run whose scorer scored less than it was offered was CPU-starved by the machine (its figure is a floor
and is marked so).  Placement packs replicas by
what they declare, not by what they use (docs/density.md, "Sizing resources.cpu"), so this is the number to
compare a spec's ``cpu`` with.  The load average is printed with each line.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import orjson  # noqa: E402
import yaml  # noqa: E402

from sie.kernel.admin import admin_client, delete_topics, group_progress  # noqa: E402
from sie.kernel.settings import Settings  # noqa: E402
from sie.schemas.spec import load  # noqa: E402
from tests.support.helpers import wait_until  # noqa: E402
from tests.support.scorer_fixtures import ScorerProcess  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"
INPUT = {"amount": 120.0, "merchant_risk": 0.2, "hour": 14, "account_age_days": 900, "is_foreign": False,
         "tx_count_24h": 3}


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def committed(admin: object, spec: object) -> int:
    """Requests the scorer group has committed (= scored: exactly-once commits offsets with the results)."""
    return group_progress(admin, spec.group_id, spec.topics.requests).committed_total  # type: ignore[attr-defined]


def paced_producer(settings: Settings, topic: str, rate: float, stop: threading.Event, sent: list[int]) -> None:
    from confluent_kafka import Producer

    producer = Producer(settings.kafka_client_config(**{"linger.ms": 5, "enable.idempotence": True}))
    start, i = time.monotonic(), 0
    while not stop.is_set():
        due = start + i / rate
        wait = due - time.monotonic()
        if wait > 0:
            stop.wait(min(wait, 0.01))  # pacing a producer, not synchronisation
            continue
        producer.produce(topic, orjson.dumps({"id": f"r{i}", "inputs": INPUT}), key=str(i % 97).encode())
        producer.poll(0)
        i += 1
    producer.flush(30)
    sent.append(i)


def measure(settings: Settings, example: str, rates: list[float], seconds: float, work: Path) -> list[str]:
    doc = yaml.safe_load((EXAMPLES / example).read_text())
    name = f"{doc['metadata']['name']}-cpu-{uuid.uuid4().hex[:6]}"
    doc["metadata"]["name"] = doc["spec"]["model"]["name"] = name
    path = EXAMPLES / f".bench-{name}.yaml"  # next to the example: its artifact path is relative to it
    path.write_text(yaml.safe_dump(doc))
    lines = []
    admin = admin_client(settings)
    try:
        spec = load(path)
        proc = ScorerProcess(path, settings.bootstrap_servers, "cpu0", work, "--partitions", "2")
        try:
            wait_until(proc.ready, 120, message=lambda: f"{name} ready: {proc.output()[-2000:]}")
            for rate in rates:
                stop, sent = threading.Event(), []
                producer = None
                if rate > 0:
                    producer = threading.Thread(target=paced_producer,
                                                args=(settings, spec.topics.requests, rate, stop, sent))
                    producer.start()
                stop.wait(10)  # warm-up at this rate
                c0, t0, n0 = cpu_seconds(proc.proc.pid), time.monotonic(), committed(admin, spec)
                stop.wait(seconds)
                c1, t1, n1 = cpu_seconds(proc.proc.pid), time.monotonic(), committed(admin, spec)
                stop.set()
                if producer is not None:
                    producer.join(60)
                used = (c1 - c0) / (t1 - t0)
                scored = (n1 - n0) / (t1 - t0)
                per_k = f", {1000 * used / scored:.3f} CPU per 1000 req/s scored" if scored > 1 else ""
                kept = "" if not rate or scored >= 0.95 * rate else " FELL BEHIND (CPU-starved: a floor)"
                lines.append(f"{example:<20} {rate:>6g} req/s offered, {scored:.0f}/s scored: {used:.3f} CPU over "
                             f"{t1 - t0:.0f}s{per_k}{kept} (load average {os.getloadavg()[0]:.1f})")
                print(lines[-1], flush=True)
        finally:
            proc.terminate()
        delete_topics(settings, [spec.topics.requests, spec.topics.results, spec.topics.dead_letters])
    finally:
        path.unlink(missing_ok=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rates", default="0,200,1000")
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    settings = Settings()
    rates = [float(r) for r in args.rates.split(",")]
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        print(f"# bench/bench_replica_cpu.py --rates {args.rates} --seconds {args.seconds:g}; "
              f"{os.cpu_count()} cores; broker {settings.bootstrap_servers}; "
              f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}", flush=True)
        for example in ("fraud-scorer.yaml", "fraud-rules.yaml"):
            measure(settings, example, rates, args.seconds, Path(tmp))


if __name__ == "__main__":
    main()
