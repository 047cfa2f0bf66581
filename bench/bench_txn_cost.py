"""What one Kafka transaction costs on this machine: client time per phase and broker CPU per commit.

Why this exists (issue 15): the scorer's light-load latency is dominated by its commit (bench_latency's
split: ~30-40 ms p50 at 200 req/s), yet a bare transaction loop on a warm, idle broker commits in a few
ms. The difference is the broker's CPU: every transaction costs the broker a fixed amount of work
(AddPartitionsToTxn and its verification, the TxnOffsetCommit through the group coordinator, the
PrepareCommit/CompleteCommit appends, one marker per partition written), and on 2 shared cores that
work queues behind everything else. This bench measures that cost in isolation, so a latency target
can be read against it: a commit cadence of C/s costs C x (broker ms per transaction) of broker CPU.

Each transaction is the scorer's shape at light load: begin, one record to each of P output
partitions, the offsets of P input partitions, commit. Transactions are paced (``--gap-ms``) the way a
light load paces commits; broker CPU is utime+stime of the broker process over the measured run.

    python bench/bench_txn_cost.py                      # P = 1 and 6, 600 transactions each
    python bench/bench_txn_cost.py --partitions 6 --transactions 2000 --out bench/results/txn-cost.txt
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import cpu_seconds, log  # noqa: E402  (bench/ is not a package)

PHASES = ("begin", "produce", "send_offsets", "commit", "total")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run(bootstrap: str, broker_pid: int, partitions: int, transactions: int, gap_s: float,
        producer_overrides: dict[str, str]) -> dict[str, object]:
    """Time ``transactions`` paced transactions touching ``partitions`` partitions; broker CPU over them."""
    topic = f"txncost.{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, partitions, 1),
                                       NewTopic(topic + ".out", partitions, 1)]).values():
        future.result(30)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g.{topic}", "enable.auto.commit": False})
    # never subscribed: its group metadata (no member, generation -1) commits offsets for a group without
    # members, which the broker accepts; a member that joins mid-run would fence the stale metadata instead
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"tx.{topic}", "acks": "all",
                         "linger.ms": 5, "retry.backoff.ms": 1, **producer_overrides})  # the scorer's settings
    producer.init_transactions(30)
    group = consumer.consumer_group_metadata()
    times: dict[str, list[float]] = {k: [] for k in PHASES}
    warm = max(20, transactions // 10)  # the first transactions find coordinators and connections: left out
    cpu0 = wall0 = 0.0
    for i in range(warm + transactions):
        if i == warm:
            cpu0, wall0 = cpu_seconds(broker_pid), time.monotonic()
        t0 = time.perf_counter()
        producer.begin_transaction()
        t1 = time.perf_counter()
        for p in range(partitions):
            producer.produce(topic + ".out", b"x" * 200, partition=p)
        producer.poll(0)
        t2 = time.perf_counter()
        producer.send_offsets_to_transaction([TopicPartition(topic, p, i) for p in range(partitions)], group, 10)
        t3 = time.perf_counter()
        producer.commit_transaction(10)
        t4 = time.perf_counter()
        if i >= warm:
            for name, (a, b) in zip(PHASES, ((t0, t1), (t1, t2), (t2, t3), (t3, t4), (t0, t4)), strict=True):
                times[name].append((b - a) * 1000)
        time.sleep(gap_s)  # pacing: the idle time between a light load's commits (not synchronisation)
    cpu = cpu_seconds(broker_pid) - cpu0
    wall = time.monotonic() - wall0
    consumer.close()
    admin.delete_topics([topic, topic + ".out"])
    return {"partitions": partitions, "transactions": transactions, "rate": transactions / wall,
            "broker_ms_per_txn": cpu * 1000 / transactions, "broker_pct": cpu * 100 / wall, "times": times}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", default="1,6", help="comma list: partitions each transaction touches")
    ap.add_argument("--transactions", type=int, default=600)
    ap.add_argument("--gap-ms", type=float, default=5.0, help="idle time between transactions")
    ap.add_argument("--bootstrap", help="an existing broker (with --broker-pid) instead of a private one")
    ap.add_argument("--broker-pid", type=int)
    ap.add_argument("--out", type=Path, help="write the report here too")
    args = ap.parse_args()

    kafka = None
    tmp = Path(tempfile.mkdtemp(prefix="sie-txncost-"))
    load0 = os.getloadavg()[0]
    try:
        if args.bootstrap:
            if not args.broker_pid:
                ap.error("--bootstrap needs --broker-pid (the broker's CPU is what is measured)")
            bootstrap, pid = args.bootstrap, args.broker_pid
        else:
            import json

            from sie.infra.kafka.local import LocalKafka, free_base_port
            from sie.kernel.settings import Settings

            kafka = LocalKafka(Settings(kafka_jit="full"), brokers=1, base_port=free_base_port(2), data_dir=tmp / "kafka")  # peak throughput: C2 too
            bootstrap = kafka.up(timeout=120)
            pid = int(next(iter(json.loads(kafka.state_file.read_text())["pids"].values())))
            log(f"private broker at {bootstrap} (pid {pid}); warming it up with 1,000 transactions")
            run(bootstrap, pid, 6, 1000, args.gap_ms / 1000, {})  # JIT and coordinators: not reported
        rows = []
        for partitions in (int(p) for p in args.partitions.split(",")):
            log(f"{args.transactions} transactions over {partitions} partition(s)")
            rows.append(run(bootstrap, pid, partitions, args.transactions, args.gap_ms / 1000, {}))
    finally:
        if kafka is not None:
            kafka.down(wipe=True)
        shutil.rmtree(tmp, ignore_errors=True)
    load1 = os.getloadavg()[0]

    lines = [f"# Cost of one Kafka transaction (bench/bench_txn_cost.py, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})",
             f"# {os.cpu_count()} cores, python {platform.python_version()}, "
             f"{'a private broker (warmed up with 1,000 transactions)' if kafka is not None else 'broker ' + bootstrap}; "
             f"{args.gap_ms:g} ms between transactions; load average {load0:.1f} -> {load1:.1f}",
             "# transaction = begin, one 200-byte record to each of P partitions, offsets of P partitions, commit",
             "",
             f"{'P':>3}{'txn/s':>8}{'broker ms/txn':>15}{'broker %':>10}   client ms p50/p99: "
             + "  ".join(PHASES)]
    for row in rows:
        times = row["times"]
        assert isinstance(times, dict)
        phases = "  ".join(f"{pct(times[k], 0.5):.1f}/{pct(times[k], 0.99):.1f}" for k in PHASES)
        lines.append(f"{row['partitions']:>3}{row['rate']:>8.0f}{row['broker_ms_per_txn']:>15.2f}"
                     f"{row['broker_pct']:>10.0f}   {phases}")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
