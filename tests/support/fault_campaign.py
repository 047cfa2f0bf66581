"""The fault campaign's driver (issue 9): faults injected into a 3-broker cluster under a steady request load.

Shared by tests/test_fault_campaign.py (a bounded CI profile, the rest with ``SIE_FAULT_CAMPAIGN=full``) and
bench/bench_faults.py (the whole campaign, table in bench/results/faults.txt and docs/reliability.md).

Two rigs, both on a cluster whose model topics have replication factor 3 and ``min.insync.replicas=2``:

- ``ScorerRig``: one real ``sie score`` process (the CLI, echo model) on a 4-partition request topic, a
  load thread producing requests at a steady rate (acks=all, idempotent), and a read_committed tail of the
  result and dead-letter topics.  Faults: SIGKILL + restart of the broker that leads a request partition,
  of the transaction coordinator of the scorer's transactional id, of the leader of the scorer group's
  ``__consumer_offsets`` partition; SIGSTOP of a broker for longer than the scorer's session timeout.
- ``ControlRig``: two ``sie control`` and two ``sie agent`` processes (tests/support/cluster_harness.py) serving
  fraud-rules under the same kind of load.  Faults: the leading control plane SIGSTOPped past its group
  session (the standby takes over) then resumed; an agent SIGSTOPped past the node timeout then resumed.

What every trial measures, from the arrival times of committed outputs (read_committed) per request
partition: the **stall** (the longest gap between two consecutive outputs of one partition around the
fault; normal gaps are ~1/(rate/partitions)) and the **recovery** (fault -> every partition has answered
a request that was produced after the fault).  After each trial every request delivered so far must have
exactly one committed output (result or dead letter) per record of it in the request topic (``account``: the
load's idempotent producer can write a request twice, librdkafka #4953): **lost** and **doubled** count the
violations.
Every wait has a deadline; a wait that reaches it fails the trial (AssertionError naming what it waited
for), it is never taken as an answer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from sie.infra.kafka.local import LocalKafka
from sie.kernel.settings import Settings
from tests.support.cluster_harness import Cluster, ResultTail, StatusTail, example_input, try_get, worker_pids
from tests.support.helpers import consume_all, leader_takeover_bound_s, wait_until
from tests.support.scorer_fixtures import ScorerProcess, echo_spec_doc

#: stall and recovery bound of the control-plane faults (seconds): a fault that stalls a partition longer
#: fails its trial.  From the configuration: the control group's session 6 s + the node timeout 6 s + a
#: worker start; x2 for a loaded 2-core host.
STALL_BOUND_S = 30.0
#: the bound of a broker fault (SIGKILL or SIGSTOP).  A call the scorer made to a frozen broker, a
#: ``send_offsets_to_transaction`` while the group coordinator is dead (librdkafka #5456), and one that waits
#: for the coordinator to finish the previous transaction's markers on a frozen partition leader, hang until
#: librdkafka's request timeouts (30-60 s by default) or the scorer's hang watchdog
#: (``ScorerConfig.txn_hang_limit_s`` 25 s, which then re-creates the producer); + a rejoin (session 6 s) +
#: the controller's fencing (5 s) + a re-created producer's ``init_transactions``: measured up to 38 s on a
#: loaded 2-core host (bench/results/faults.txt), so 60 s.  Without a coordinator or a hung call: 6-10 s.
BROKER_BOUND_S = 60.0
#: the scorer's consumer-group session timeout (tests.support.scorer_fixtures.ScorerProcess passes it)
SCORER_SESSION_S = 6.0
PARTITIONS = 4
#: where every scorer trial keeps its logs (``ScorerRig.keep_logs``): one folder per trial, with the scorer's log
#: (librdkafka's ``SIE_FAULT_KAFKA_DEBUG`` contexts in it) and each broker's server.log; SIE_FAULT_LOGS moves it
FAULT_LOGS = Path(os.environ.get("SIE_FAULT_LOGS") or Path(__file__).resolve().parents[2] / ".cache" / "fault-runs")
#: the librdkafka debug contexts of the campaign's ``sie score`` (SIE_KAFKA_DEBUG): the transaction state machine,
#: so that an unexpected outcome can be read from the kept log; SIE_FAULT_KAFKA_DEBUG="" turns it off
SCORER_KAFKA_DEBUG = os.environ.get("SIE_FAULT_KAFKA_DEBUG", "eos")
#: the instruments' (load producer, result tail) request timeouts: librdkafka's defaults (30 s produce, 60 s
#: socket) would make the test's own clients wait out a frozen broker and the stall measured be theirs
INSTRUMENT_TIMEOUTS = {"request.timeout.ms": 3000, "socket.timeout.ms": 3000}


# --------------------------------------------------------------------------------------------- results


@dataclass(frozen=True)
class FaultResult:
    fault: str
    target: str
    stall_s: float
    recovery_s: float
    delivered: int
    lost: int
    doubled: int
    bound_s: float
    note: str = ""

    def row(self) -> str:
        return (f"| {self.fault} | {self.target} | {self.stall_s:.2f} | {self.recovery_s:.2f} | {self.bound_s:g} "
                f"| {self.delivered} | {self.lost} | {self.doubled} | {self.note} |")


TABLE_HEADER = ("| fault | target | stall (s) | recovery (s) | bound (s) | requests | lost | doubled | notes |\n"
                "|---|---|---|---|---|---|---|---|---|")


# ------------------------------------------------------------------------------------- kafka lookups


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode`` (over UTF-16 code units, int32 overflow), which the broker uses to place a
    transactional id / group id on a partition of ``__transaction_state`` / ``__consumer_offsets``."""
    raw = text.encode("utf-16-be")
    h = 0
    for i in range(0, len(raw), 2):
        h = (31 * h + (raw[i] << 8 | raw[i + 1])) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(key: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(key.hashCode) % partitions`` (``Utils.abs(MIN_VALUE) == 0``)."""
    h = java_string_hash(key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


def partition_leaders(settings: Settings, topic: str) -> dict[int, int]:
    """partition -> leader broker id now (-1 while leaderless)."""
    from sie.kernel.admin import admin_client

    meta = admin_client(settings).list_topics(topic, timeout=10).topics[topic]
    return {p: m.leader for p, m in meta.partitions.items()}


def txn_coordinator(settings: Settings, transactional_id: str) -> tuple[int, int]:
    """(partition of ``__transaction_state``, its leader = the transaction coordinator of ``transactional_id``)."""
    leaders = partition_leaders(settings, "__transaction_state")
    p = coordinator_partition(transactional_id, len(leaders))
    return p, leaders[p]


def group_coordinator(settings: Settings, group_id: str) -> tuple[int, int]:
    """(partition of ``__consumer_offsets``, its leader = the group coordinator), cross-checked against the
    coordinator the broker names for the group (``describe_consumer_groups``)."""
    from sie.kernel.admin import admin_client

    leaders = partition_leaders(settings, "__consumer_offsets")
    p = coordinator_partition(group_id, len(leaders))
    admin = admin_client(settings)  # held until the future is done: a collected client never completes it
    desc = admin.describe_consumer_groups([group_id], request_timeout=10)[group_id].result(timeout=15)
    assert desc.coordinator.id == leaders[p], (
        f"group {group_id}: broker names coordinator {desc.coordinator.id}, __consumer_offsets p{p} is led by {leaders[p]}")
    return p, leaders[p]


# ------------------------------------------------------------------------------------------ the load


class Load:
    """Requests at a steady rate from a thread; remembers each id's partition (delivery report) and send time."""

    def __init__(self, settings: Settings, topic: str, inputs_of: Callable[[int], dict[str, Any]], tag: str,
                 rate_per_s: float, debug_log: Path | None = None) -> None:
        """``debug_log``: a file for the producer's librdkafka ``eos`` debug lines (its PID, epoch bumps and
        partition drains: a request it writes twice, librdkafka #4953, is read from there)."""
        from confluent_kafka import Producer

        self.topic, self.tag, self.rate, self._inputs_of = topic, tag, rate_per_s, inputs_of
        self.debug_log = debug_log
        extra: dict[str, Any] = {}
        if debug_log is not None:
            import logging

            logger = logging.getLogger(f"tests.support.fault_campaign.load.{tag}.{uuid.uuid4().hex[:6]}")
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
            handler = logging.FileHandler(debug_log)
            handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
            logger.addHandler(handler)
            extra = {"debug": "eos", "logger": logger}
        self._producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True,
                                                                  "linger.ms": 5, **INSTRUMENT_TIMEOUTS, **extra}))
        self.partition_of: dict[str, int] = {}
        self.sent_at: dict[str, float] = {}
        self.errors: list[str] = []
        self._n = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"load-{tag}", daemon=True)

    def start(self) -> Load:
        self._thread.start()
        return self

    def _delivered(self, err: Any, msg: Any) -> None:
        rid = msg.key().decode()
        with self._lock:
            if err is not None:
                self.errors.append(f"{rid}: {err}")
            else:
                self.partition_of[rid] = msg.partition()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            rid = f"{self.tag}-{self._n}"
            value = json.dumps({"id": rid, "inputs": self._inputs_of(self._n)}).encode()
            with self._lock:
                self.sent_at[rid] = time.monotonic()
            try:
                self._producer.produce(self.topic, value, key=rid.encode(), on_delivery=self._delivered)
                self._n += 1
            except BufferError:
                pass  # the queue is full while a broker is away: try again on the next tick
            self._producer.poll(0)
            next_at += 1.0 / self.rate
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def delivered(self) -> dict[str, int]:
        with self._lock:
            return dict(self.partition_of)

    def stop(self) -> int:
        """Stop producing and flush; AssertionError if a request was not delivered.  Returns how many were sent."""
        self._stop.set()
        self._thread.join(10)
        left = self._producer.flush(60)
        if left or self.errors:
            raise AssertionError(f"producing to {self.topic}: {left} undelivered, errors {self.errors[:3]}")
        return self._n


# ------------------------------------------------------------------------------------------ measuring


def account(ids: Iterable[str], outputs: Mapping[str, int], records: Mapping[str, list[tuple[int, int]]]
            ) -> tuple[list[str], dict[str, int]]:
    """The exactly-once account per request RECORD: (ids with fewer outputs than records, id -> outputs beyond its
    records).  A request the load's producer wrote twice (``Observer.request_records``) is two requests to the
    stage and must have two outputs; every other request exactly one (an id not found among the records: one)."""
    lost, doubled = [], {}
    for rid in ids:
        want, got = max(1, len(records.get(rid, ()))), outputs.get(rid, 0)
        if got < want:
            lost.append(rid)
        elif got > want:
            doubled[rid] = got - want
    return sorted(lost), doubled


def _at(positions: Iterable[tuple[int, int]]) -> str:
    return ",".join(f"p{p}@{o}" for p, o in positions) or "none found"


def _outputs_of(settings: Settings, topics: dict[str, str], rids: set[str]) -> dict[str, list[str]]:
    """Request id -> its committed outputs, each as 'topic-kind p@offset (source pS@O, produced HH:MM:SS.mmm)'."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(settings.kafka_client_config(**{
        "group.id": f"explain-{uuid.uuid4().hex[:10]}", "enable.auto.commit": False,
        "isolation.level": "read_committed", "enable.partition.eof": True}))
    out: dict[str, list[str]] = {}
    try:
        for kind in ("results", "dead_letters"):
            topic = topics[kind]
            parts = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
            consumer.assign([TopicPartition(topic, p, -2) for p in parts])
            eof: set[int] = set()
            deadline = time.monotonic() + 30
            while len(eof) < len(parts) and time.monotonic() < deadline:
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is not None:
                        eof.add(msg.partition())
                        continue
                    try:
                        doc = json.loads(msg.value() or b"{}")
                    except ValueError:
                        continue
                    rid = str(doc.get("id"))
                    if rid in rids:
                        src = doc.get("source") or {}
                        stamp = time.strftime("%H:%M:%S", time.gmtime(msg.timestamp()[1] / 1000))
                        out.setdefault(rid, []).append(
                            f"{kind} p{msg.partition()}@{msg.offset()} (source p{src.get('partition')}@"
                            f"{src.get('offset')}, produced {stamp}.{msg.timestamp()[1] % 1000:03d} UTC)")
            consumer.unassign()
    finally:
        consumer.close()
    return out


class Observer:
    """The load plus a read_committed tail of its outputs; turns arrivals into stall / recovery / proof."""

    def __init__(self, settings: Settings, topics: dict[str, str], load: Load, partitions: int) -> None:
        self.settings, self.topics, self.load, self.partitions = settings, topics, load, partitions
        #: more context for a failed wait (the rig's logs, partition leaders)
        self.diagnose: Callable[[], str] = lambda: ""
        self.stall_began: dict[int, float] = {}
        self.tail = ResultTail(settings, topics, **INSTRUMENT_TIMEOUTS)
        #: what the last ``settle``/``prove`` found beyond the counts (``explain``): '' when nothing
        self.account_note = ""

    def _arrivals(self) -> list[tuple[float, str]]:
        with self.tail._lock:  # noqa: SLF001 - read-only snapshot
            return list(self.tail.order)

    def steady(self, timeout: float = 60.0) -> None:
        """Every request partition answered a request produced from now on (the trial starts from a flowing load)."""
        self.wait_answered_after(time.monotonic(), timeout, "steady load before the fault")

    def answered_after(self, t: float) -> set[int]:
        """Request partitions with an output for a request produced after ``t``."""
        delivered = self.load.delivered()
        with self.load._lock:  # noqa: SLF001
            sent_at = dict(self.load.sent_at)
        return {delivered[rid] for _, rid in self._arrivals() if rid in delivered and sent_at.get(rid, 0) > t}

    def wait_answered_after(self, t: float, timeout: float, what: str,
                            also: Callable[[], bool] = lambda: True) -> float:
        """Until every request partition answered a request produced after ``t`` (and ``also()``): returns when."""
        def done() -> bool:
            return len(self.answered_after(t)) == self.partitions and also()

        wait_until(done, timeout, interval=0.1,
                   message=lambda: f"{what}: partitions answering requests produced after the fault "
                                   f"{sorted(self.answered_after(t))} of {self.partitions}{self.diagnose()}")
        return time.monotonic()

    def measure(self, t0: float, end: float) -> tuple[float, float]:
        """(longest per-partition gap between outputs in [last output before t0, end], fault -> every partition
        answered a request produced after the fault)."""
        stalls, recovery = self.per_partition(t0, end)
        return max(stalls.values(), default=end - t0), recovery

    def per_partition(self, t0: float, end: float) -> tuple[dict[int, float], float]:
        """(request partition -> its longest gap between outputs in [its last output before t0, end], fault ->
        every partition answered a request produced after the fault)."""
        delivered = self.load.delivered()
        with self.load._lock:  # noqa: SLF001
            sent_at = dict(self.load.sent_at)
        per: dict[int, list[float]] = {}
        first_new: dict[int, float] = {}
        for at, rid in self._arrivals():
            p = delivered.get(rid)
            if p is None or at > end:
                continue
            per.setdefault(p, []).append(at)
            if sent_at.get(rid, 0) > t0:
                first_new[p] = min(first_new.get(p, at), at)
        stalls: dict[int, float] = {}
        #: partition -> when (seconds after t0) its longest gap began: what a trial's notes name
        self.stall_began: dict[int, float] = {}
        for p, times in per.items():
            before = [t for t in times if t <= t0]
            seq = [before[-1] if before else t0, *(t for t in times if t > t0), end]
            gap, began = max((b - a, a) for a, b in zip(seq, seq[1:]))
            stalls[p], self.stall_began[p] = gap, began - t0
        for p in range(self.partitions):
            if p not in stalls:  # never answered at all: silent the whole window
                stalls[p], self.stall_began[p] = end - t0, 0.0
        recovery = max(first_new.values(), default=end) - t0
        return stalls, recovery

    def request_records(self, timeout: float = 60.0) -> dict[str, list[tuple[int, int]]]:
        """Request id -> its records ``(partition, offset)`` in the request topic.  More than one: the load's
        producer wrote that request twice (an idempotent librdkafka producer can, when an OUT_OF_ORDER_SEQUENCE on
        one partition bumps its epoch while a batch of another partition is possibly persisted: librdkafka #4953),
        and each of its records must be answered once."""
        out: dict[str, list[tuple[int, int]]] = {}
        for rec in consume_all(self.settings, self.topics["requests"], timeout=timeout):
            if rec.key is not None:
                out.setdefault(rec.key.decode(), []).append((rec.partition, rec.offset))
        return out

    def _outputs(self) -> dict[str, int]:
        with self.tail._lock:  # noqa: SLF001 - read-only snapshot
            return {rid: len(v) for rid, v in self.tail.arrivals.items()}

    def settle(self, timeout: float = 90.0) -> tuple[int, int, int]:
        """(delivered, lost, doubled) over every request delivered so far, once each of its records has an output
        (deadline: AssertionError listing the missing ids).  Reads the tail on to the end first, so a duplicate
        committed after the awaited count is counted too.  Counted per request RECORD (``account``); what the
        load wrote twice and what was doubled are described in ``self.account_note``."""
        ids = list(self.load.delivered())
        wait_until(lambda: self.tail.count(ids) == len(ids), timeout, interval=0.2,
                   message=lambda: f"an output for each of {len(ids)} requests (missing: "
                                   f"{self.tail.audit(ids)[0][:10]}){self.diagnose()}")
        records = self.request_records()
        wait_until(lambda: not account(ids, self._outputs(), records)[0], timeout, interval=0.2,
                   message=lambda: f"an output for each record of a request the load wrote twice "
                                   f"{account(ids, self._outputs(), records)[0][:10]}{self.diagnose()}")
        self.tail.read_to_end()
        lost, doubled = account(ids, self._outputs(), records)
        with self.load._lock:  # noqa: SLF001 - ids produced; a delivery report may still be on its way
            stray = [rid for rid in self.tail.audit([])[2] if rid not in self.load.sent_at]
        assert not stray, f"outputs for requests never sent: {stray[:10]}"
        self.account_note = self.explain(doubled, records)
        return len(ids), len(lost), sum(doubled.values())

    def explain(self, doubled: dict[str, int], records: dict[str, list[tuple[int, int]]]) -> str:
        """What the load wrote twice (not a fault of the stage), and, per doubled request, its request records and
        every output: topic, partition@offset, the request record it answers (``source``) and when it was produced
        (CreateTime, to find the transaction and producer in the kept scorer log).  '' when there is neither."""
        twice = {rid: recs for rid, recs in records.items() if len(recs) > 1}
        parts = []
        if twice:
            parts.append(f"the load wrote {len(twice)} request(s) twice, each record answered once (librdkafka "
                         f"#4953): " + ", ".join(f"{rid} {_at(recs)}" for rid, recs in sorted(twice.items())[:5]))
        if doubled:
            outs = _outputs_of(self.settings, self.topics, set(doubled))
            parts.append("DOUBLED: " + "; ".join(
                f"{rid}: request {_at(records.get(rid, []))}, outputs " + ", ".join(outs.get(rid, []))
                for rid in sorted(doubled)[:5]))
        return " / ".join(parts)

    def prove(self, timeout: float = 60.0) -> tuple[int, int, int]:
        """The independent read_committed proof after the load stopped: a fresh reader from the beginning of
        the result and dead-letter topics; (requests, lost, doubled), per request record (``account``);
        ``self.account_note`` describes what the load wrote twice and any doubled request."""
        from tests.support.scorer_fixtures import request_id_of_dead_letter

        n = self.load.stop()
        ids = set(self.load.delivered())
        assert len(ids) == n, f"{n} sent, {len(ids)} delivered"
        self.settle(timeout)  # every request has an output (deadline) before the fresh reader reads to the end
        results = consume_all(self.settings, self.topics["results"], timeout=timeout)
        dlq = consume_all(self.settings, self.topics["dead_letters"], timeout=timeout)
        seen = Counter(json.loads(r.value)["id"] for r in results if r.value)
        seen.update(request_id_of_dead_letter(r.value, {k: v or b"" for k, v in r.headers.items()}) for r in dlq)
        assert not set(seen) - ids, f"outputs for requests never sent: {sorted(set(seen) - ids)[:10]}"
        records = self.request_records(timeout)
        lost, doubled = account(ids, seen, records)
        self.account_note = self.explain(doubled, records)
        return n, len(lost), sum(doubled.values())

    def close(self) -> None:
        self.tail.close()


# --------------------------------------------------------------------------------------- scorer rig


def copy_from(source: Path, target: Path, offset: int) -> int:
    """Copy ``source`` from byte ``offset`` on into ``target`` (all of it if it shrank: rotated); returns its size."""
    size = source.stat().st_size
    start = offset if offset <= size else 0
    with source.open("rb") as src, target.open("wb") as dst:
        src.seek(start)
        while chunk := src.read(1 << 20):
            dst.write(chunk)
    return size


class ScorerRig:
    """A real ``sie score`` process (echo model) under load on the 3-broker cluster ``kafka``."""

    def __init__(self, kafka: LocalKafka, root: Path, rate_per_s: float = 40.0,
                 scorer_env: dict[str, str] | None = None) -> None:
        """``scorer_env``: more environment for the ``sie score`` process (e.g. ``SIE_KAFKA_EXTRA`` to try other
        librdkafka settings against the same faults)."""
        from sie.kernel.admin import ensure_model_topics, topic_configs
        from sie.schemas.spec import load

        self.kafka = kafka
        self.settings = kafka.settings_for_clients().with_overrides(request_partitions=PARTITIONS)
        doc = echo_spec_doc(f"fault-{uuid.uuid4().hex[:8]}")
        Path(root).mkdir(parents=True, exist_ok=True)
        self.spec_path = Path(root) / f"{doc['metadata']['name']}.yaml"
        self.spec_path.write_text(yaml.safe_dump(doc), encoding="utf-8")
        self.spec = load(doc, topic_prefix=self.settings.topic_prefix)
        t = self.spec.topics
        self.topics = {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters}
        report = ensure_model_topics(self.settings, list(self.topics.values()), PARTITIONS)
        assert {o.replication for o in report.topics} == {3}, report.table()
        for topic in self.topics.values():
            assert topic_configs(self.settings, topic)["min.insync.replicas"] == "2", topic
        self.instance = "f0"
        self.transactional_id = self.settings.names.scorer_transactional_id(self.spec.name, self.instance)
        self.group_id = self.spec.group_id
        self.root = Path(root)
        debug = {"SIE_KAFKA_DEBUG": SCORER_KAFKA_DEBUG} if SCORER_KAFKA_DEBUG else {}
        self.scorer = ScorerProcess(self.spec_path, self.settings.bootstrap_servers, self.instance, self.root,
                                    env={**debug, **(scorer_env or {})})
        wait_until(self.scorer.ready, 90, interval=0.2, message=lambda: f"scorer ready:\n{self.scorer.output()[-2000:]}")
        self.load = Load(self.settings, t.requests, lambda n: {"x": float(n)}, "f", rate_per_s,
                         debug_log=self.root / "load-producer.log").start()
        self.observer = Observer(self.settings, self.topics, self.load, PARTITIONS)
        self.observer.diagnose = self.diagnose
        self.observer.steady(90)
        self._log_seen = len(self.scorer.output())
        #: the folder the last trial's logs were kept in (``keep_logs``)
        self.last_logs: Path | None = None
        #: how far each log was copied by the previous trials (``keep_logs``)
        self._copied: dict[Path, int] = {}

    def diagnose(self) -> str:
        try:
            leaders = partition_leaders(self.settings, self.topics["requests"])
        except Exception as exc:  # noqa: BLE001 - context for a failure message only
            leaders = {-1: repr(exc)}  # type: ignore[dict-item]
        return (f"\nrequest partition leaders {leaders}; delivered {len(self.load.delivered())}/{self.load._n}, "  # noqa: SLF001
                f"outputs {self.observer.tail.count()}\nscorer log tail:\n{self.scorer.output()[-2500:]}")

    def alive(self) -> None:
        """The scorer rode the fault out in-process: it never exited."""
        assert self.scorer.proc.poll() is None, (
            f"sie score exited with {self.scorer.proc.returncode}:\n{self.scorer.output()[-3000:]}")

    # -- targets ------------------------------------------------------------------------------------

    def roles(self, broker: int) -> str:
        """What ``broker`` is to the scorer now: leader of which request partitions, which coordinator."""
        leaders = partition_leaders(self.settings, self.topics["requests"])
        led = sorted(p for p, b in leaders.items() if b == broker)
        roles = [f"leads requests p{','.join(map(str, led))}"] if led else []
        if txn_coordinator(self.settings, self.transactional_id)[1] == broker:
            roles.append("txn coordinator")
        if group_coordinator(self.settings, self.group_id)[1] == broker:
            roles.append("group coordinator")
        return f"broker {broker} ({', '.join(roles) or 'no role'})"

    def request_leader(self) -> tuple[int, str]:
        """The leader of request partition 0."""
        broker = partition_leaders(self.settings, self.topics["requests"])[0]
        return broker, self.roles(broker)

    def txn_coordinator(self) -> tuple[int, str]:
        """The transaction coordinator of the scorer's transactional id (leader of its __transaction_state partition)."""
        p, broker = txn_coordinator(self.settings, self.transactional_id)
        return broker, f"{self.roles(broker)}, __transaction_state p{p}"

    def offsets_leader(self) -> tuple[int, str]:
        """The leader of the scorer group's __consumer_offsets partition (its group coordinator)."""
        p, broker = group_coordinator(self.settings, self.group_id)
        return broker, f"{self.roles(broker)}, __consumer_offsets p{p}"

    # -- faults -------------------------------------------------------------------------------------

    def keep_logs(self, fault: str, outcome: str) -> Path:
        """Copy what the scorer's log and every broker's server.log gained since the rig's previous trial into a
        folder of this trial's own under ``FAULT_LOGS`` (named by time, fault and outcome); returns it.  Every
        trial keeps them, passed or not: a rare outcome (issue 35's duplicate, 1 run in 55) must be readable
        afterwards.  Slices, not whole files: a rig looped 200 times (bench/bench_faults.py --repeats) would
        otherwise copy its growing logs 200 times over."""
        import re

        key = re.sub(r"[^a-z0-9]+", "-", fault.lower()).strip("-")[:40]
        folder = FAULT_LOGS / f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{key}-{outcome}"
        folder.mkdir(parents=True, exist_ok=True)
        sources = [(Path(self.scorer.log_path), "scorer.log")]
        if self.load.debug_log is not None:  # the request producer's eos lines
            sources.append((Path(self.load.debug_log), "load-producer.log"))
        sources += [(node.server_log, f"broker-{node.node_id}-server.log") for node in self.kafka.layout.nodes]
        for source, name in sources:
            if source.exists():
                self._copied[source] = copy_from(source, folder / name, self._copied.get(source, 0))
        return folder

    @contextmanager
    def _trial(self, fault: str) -> Iterator[None]:
        """Logs kept whatever the trial's end (``keep_logs``); a failure names the folder."""
        try:
            yield
        except AssertionError as exc:
            folder = self.keep_logs(fault, "failed")
            raise AssertionError(f"{exc}\n(logs kept in {folder})") from exc
        self.last_logs = self.keep_logs(fault, "ok")

    def kill_and_restart(self, fault: str, target: tuple[int, str]) -> FaultResult:
        """SIGKILL the broker; scoring must go on on the other two; restart it; scoring must go on again."""
        with self._trial(fault):
            return self._kill_and_restart(fault, target)

    def _kill_and_restart(self, fault: str, target: tuple[int, str]) -> FaultResult:
        broker, desc = target
        obs = self.observer
        obs.steady()
        self.scorer_said()  # what it said before the fault is not this trial's
        t0 = time.monotonic()
        self.kafka.kill_broker(broker)
        try:
            obs.wait_answered_after(t0, BROKER_BOUND_S, f"{fault}: scoring with broker {broker} dead")
        finally:
            self.kafka.start_broker(broker, timeout=120)
        t1 = time.monotonic()
        end = obs.wait_answered_after(t1, BROKER_BOUND_S, f"{fault}: scoring after broker {broker} restarted")
        return self._result(fault, desc, t0, end, f"broker down {t1 - t0:.1f} s", BROKER_BOUND_S)

    def pause_and_resume(self, fault: str, target: tuple[int, str], hold_s: float = 1.5 * SCORER_SESSION_S
                         ) -> FaultResult:
        """SIGSTOP the broker for at least ``hold_s`` (past the scorer's session timeout) and until scoring
        went on without it; SIGCONT; scoring must go on with it back."""
        with self._trial(fault):
            return self._pause_and_resume(fault, target, hold_s)

    def _pause_and_resume(self, fault: str, target: tuple[int, str], hold_s: float) -> FaultResult:
        broker, desc = target
        obs = self.observer
        obs.steady()
        self.scorer_said()
        t0 = time.monotonic()
        self.kafka.pause_broker(broker)
        try:
            obs.wait_answered_after(t0, max(BROKER_BOUND_S, hold_s), f"{fault}: scoring with broker {broker} paused",
                                    also=lambda: time.monotonic() - t0 >= hold_s)
        finally:
            self.kafka.resume_broker(broker)
        t1 = time.monotonic()
        end = obs.wait_answered_after(t1, BROKER_BOUND_S, f"{fault}: scoring after broker {broker} resumed")
        return self._result(fault, desc, t0, end, f"paused {t1 - t0:.1f} s", BROKER_BOUND_S)

    def _result(self, fault: str, desc: str, t0: float, end: float, note: str, bound: float) -> FaultResult:
        stall, recovery = self.observer.measure(t0, end)
        delivered, lost, doubled = self.observer.settle()
        self.alive()
        said = self.scorer_said()
        account = self.observer.account_note
        return FaultResult(fault, desc, stall, recovery, delivered, lost, doubled, bound,
                           note + (f"; {account}" if account else "") + (f"; scorer: {said}" if said else ""))

    def scorer_said(self) -> str:
        """What the scorer's exactly-once layer reported since the last call (the trial's recovery path), short."""
        text = self.scorer.output()
        new, self._log_seen = text[self._log_seen:], len(text)
        said = []
        for line in new.splitlines():
            if " sie.eos: " in line and ("ERROR" in line or "WARNING" in line):
                msg = line.split(" sie.eos: ", 1)[1]
                msg = msg.split(" (dropped")[0].split("; re-creating")[0][:110]
                if msg not in said:
                    said.append(msg)
        return " / ".join(said)

    def close(self) -> tuple[int, int, int]:
        """Stop the load, the independent proof (requests, lost, doubled), stop the scorer."""
        try:
            return self.observer.prove()
        finally:
            self.observer.close()
            self.scorer.ensure_dead()


@contextmanager
def scorer_rig(kafka: LocalKafka, root: Path, rate_per_s: float = 40.0) -> Iterator[ScorerRig]:
    rig = ScorerRig(kafka, root, rate_per_s)
    try:
        yield rig
    finally:
        rig.observer.close()
        rig.scorer.ensure_dead()


# -------------------------------------------------------------------------------------- control rig

RULES = "fraud-rules"


class ControlRig:
    """Two ``sie control`` (leader + standby) and two ``sie agent`` serving fraud-rules (1 replica) under load.

    ``net`` (the partition campaign, tests/support/partition_campaign.py): every process on its own node of the test
    network: the control planes on c1/c2, the agents (and their workers) on a1/a2, the load and the CLI on
    the client node."""

    def __init__(self, kafka: LocalKafka, root: Path, rate_per_s: float = 20.0, net: Any = None) -> None:
        settings = kafka.settings_for_clients()
        topo = net.topo if net is not None else None
        self.c = Cluster(settings, Path(root), hosts=topo, cli_host="client" if topo else None)
        c = self.c
        on = (lambda node: node) if topo else (lambda node: None)
        self.controls = [c.start_control("cp-1", host=on("c1")), c.start_control("cp-2", host=on("c2"))]
        self.agents = [c.start_agent("node-a", host=on("a1")), c.start_agent("node-b", host=on("a2"))]
        c.wait_leader(90)
        wait_until(lambda: len([n for n in (try_get(c.api(), "/v1/nodes") or {}).get("nodes", [])
                                if n["status"] == "online"]) == 2, 60, message=lambda: "both agents online; " + c.logs())
        self.spec_path = c.write_spec(RULES, resources={"cpu": 0.25})
        done = c.sie("apply", "-f", str(self.spec_path))
        assert done.returncode == 0, done.stdout + done.stderr
        c.wait_ready(RULES, 1, timeout=120)
        self.settings = c.settings
        self.topics = c.spec_topics(RULES)
        example = example_input(self.spec_path)
        with topo.entered("client") if topo else contextlib.nullcontext():  # the load's producer and thread
            self.load = Load(self.settings, self.topics["requests"],
                             lambda n: {**example, "amount": float(10 + n % 5000)}, "c", rate_per_s)
            self.load.start()
        self.status = StatusTail(self.settings)
        #: (fault, heal, end) of the last trial (monotonic)
        self.last_window = (0.0, 0.0, 0.0)
        partitions = len(partition_leaders(self.settings, self.topics["requests"]))
        self.observer = Observer(self.settings, self.topics, self.load, partitions)

    def steady(self) -> None:
        self.observer.steady(90)

    def _health(self, proc: Any) -> dict[str, Any]:
        return try_get(proc.port, "/healthz") or {}

    def leader_pause(self, fault: str = "(e) control-plane leader SIGSTOP past its session, SIGCONT") -> FaultResult:
        """SIGSTOP the leading control plane; the standby takes over with a higher epoch; a second model applied
        through the new leader meanwhile (the paused one's view is now stale) is placed; SIGCONT: the resumed
        instance must step down and never write as leader again: no committed LeaderEpoch/Assignment with its
        old epoch after the new leader's first record, the new model's replica never drained."""
        return self.leader_isolated(fault, lambda p: os.kill(p.pid, signal.SIGSTOP),
                                    lambda p: os.kill(p.pid, signal.SIGCONT))

    def leader_isolated(self, fault: str, isolate: Callable[[Any], None], restore: Callable[[Any], None],
                        model: str = "fraud-rules-b") -> FaultResult:
        """``leader_pause`` with any isolation of the leader: ``isolate(proc)`` (SIGSTOP, its node's link cut)
        and ``restore(proc)``; ``model``: the name of the model applied through the new leader meanwhile."""
        c = self.c
        self.steady()
        leader = c.wait_leader(60)
        standby = next(p for p in self.controls if p is not leader)
        wait_until(lambda: self._health(standby).get("role") == "standby", 30, message="a standby")
        old_epoch = int(self._health(leader)["epoch"])
        t0 = time.monotonic()
        isolate(leader)
        try:
            wait_until(lambda: self._health(standby).get("role") == "leader", 2 * leader_takeover_bound_s(), 0.2,
                       message=lambda: "the standby to take over; " + c.logs("control"))
            takeover = time.monotonic() - t0
            new_epoch = int(self._health(standby)["epoch"])
            assert new_epoch > old_epoch, (old_epoch, new_epoch)
            second = c.write_spec(RULES, name=model, resources={"cpu": 0.25})
            done = c.sie("apply", "-f", str(second))  # through the live leader (the paused one answers nothing)
            assert done.returncode == 0, done.stdout + done.stderr
            c.wait_ready(model, 1, timeout=90, port=standby.port)
            second_workers = {rid: pid for rid, (_, pid) in c.all_workers().items() if rid.startswith(f"{model}-")}
            assert second_workers, c.all_workers()
        finally:
            restore(leader)
        t1 = time.monotonic()
        # the resumed instance learns it lost partition 0 (or is fenced on its first write) and steps down
        wait_until(lambda: (h := self._health(leader)) and h.get("role") != "leader" or
                   (h.get("role") == "leader" and int(h.get("epoch", 0)) > new_epoch), 60, 0.2,
                   message=lambda: f"the resumed control plane to step down; health {self._health(leader)}")
        stepped_down = time.monotonic() - t1
        # one node timeout (6 s) + reconcile passes of the resumed instance: proved by the standby's view of
        # the second model staying Ready with the same worker, and by the committed records below
        end = self.observer.wait_answered_after(t1, STALL_BOUND_S, f"{fault}: scoring after the resume")
        wait_until(lambda: c.ready_model(model, 1, standby.port), 30, message=f"{model} still Ready")
        self._assert_no_zombie_writes(old_epoch, new_epoch)
        now_workers = {rid: pid for rid, (_, pid) in c.all_workers().items() if rid.startswith(f"{model}-")}
        assert now_workers == second_workers, f"the new model's replica was restarted: {second_workers} -> {now_workers}"
        self.last_window = (t0, t1, end)
        return self._result(fault, f"cp {leader.name} (epoch {old_epoch} -> {standby.name} epoch {new_epoch})", t0, end,
                            f"takeover {takeover:.1f} s, the old leader stepped down {stepped_down:.1f} s after the "
                            "fault ended, no write with the old epoch")

    def _assert_no_zombie_writes(self, old_epoch: int, new_epoch: int) -> None:
        from sie.schemas.avro_codec import decode

        leader_records = [decode(r.value) for r in consume_all(self.settings, f"{self.c.prefix}.control-leader", timeout=30)]
        epochs = [int(v["epoch"]) for v in leader_records]
        assert epochs == sorted(set(epochs)), f"control-leader epochs not strictly increasing: {epochs}"
        assert new_epoch in epochs and old_epoch in epochs, (old_epoch, new_epoch, epochs)
        by_partition: dict[int, list[int]] = {}
        for r in consume_all(self.settings, f"{self.c.prefix}.assignments", timeout=30):
            by_partition.setdefault(r.partition, []).append(int(decode(r.value)["epoch"]))
        for p, seq in by_partition.items():
            if new_epoch in seq:
                after = seq[seq.index(new_epoch):]
                assert all(e >= new_epoch for e in after), f"assignments p{p}: epoch {old_epoch} after {new_epoch}: {seq}"

    def agent_pause(self, fault: str = "(f) agent SIGSTOP past the node timeout, SIGCONT") -> FaultResult:
        """SIGSTOP the agent running the fraud-rules replica (its worker keeps running): the control plane moves
        the replica (same transactional id: the new worker fences the old); SIGCONT: the resumed agent drains its
        stale replica; exactly one worker of the replica remains."""
        return self.agent_isolated(fault, lambda p: os.kill(p.pid, signal.SIGSTOP),
                                   lambda p: os.kill(p.pid, signal.SIGCONT))

    def agent_isolated(self, fault: str, isolate: Callable[[Any], None], restore: Callable[[Any], None]
                       ) -> FaultResult:
        """``agent_pause`` with any isolation of the agent: ``isolate(proc)`` (SIGSTOP; its node's link cut, which
        cuts its worker off too) and ``restore(proc)``."""
        c = self.c
        self.steady()
        placement = c.placement(RULES)
        (rid, node), = placement.items()
        agent = c.agent(node)
        other = next(a for a in self.agents if a is not agent)
        old_pid = worker_pids(agent.pid)[rid]
        wall, t0 = time.time(), time.monotonic()
        isolate(agent)
        try:
            wait_until(lambda: self.status.ready_after(rid, wall, other.name), 90, 0.2,
                       message=lambda: f"{rid} READY on {other.name}; " + c.logs())
            moved = time.monotonic() - t0
        finally:
            restore(agent)
        t1 = time.monotonic()
        wait_until(lambda: rid not in worker_pids(agent.pid), 60, 0.2,
                   message=lambda: f"the resumed agent {node} to stop its stale {rid} (pid {old_pid}); " + c.logs("agent"))
        drained = time.monotonic() - t1
        end = self.observer.wait_answered_after(t1, STALL_BOUND_S, f"{fault}: scoring after the resume")
        assert rid in worker_pids(other.pid) and rid not in worker_pids(agent.pid)
        self.last_window = (t0, t1, end)
        return self._result(fault, f"agent {node} ({rid})", t0, end,
                            f"replica READY on {other.name} {moved:.1f} s after the fault; stale worker stopped "
                            f"{drained:.1f} s after it ended")

    def _result(self, fault: str, desc: str, t0: float, end: float, note: str) -> FaultResult:
        stall, recovery = self.observer.measure(t0, end)
        delivered, lost, doubled = self.observer.settle()
        account = self.observer.account_note
        return FaultResult(fault, desc, stall, recovery, delivered, lost, doubled, STALL_BOUND_S,
                           note + (f"; {account}" if account else ""))

    def close(self) -> tuple[int, int, int]:
        try:
            return self.observer.prove()
        finally:
            self.observer.close()
            self.status.close()
            self.c.close()


@contextmanager
def control_rig(kafka: LocalKafka, root: Path, rate_per_s: float = 20.0) -> Iterator[ControlRig]:
    rig = ControlRig(kafka, root, rate_per_s)
    try:
        yield rig
    finally:
        rig.observer.close()
        rig.status.close()
        rig.c.close()
