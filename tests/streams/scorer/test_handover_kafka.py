"""Planned stops vs crashes of static-membership scorers, on a real broker (sie.streams.eos.transaction.leave_group).

* A scorer stopped ON PURPOSE leaves its group after its last commit: the other scorer owns every partition
  within a few heartbeats, far under the session timeout a static member's partitions used to wait out.
* A worker SIGKILLed and restarted under its replica id (the agent's restart) takes its place back as the
  same static member: the other worker is never revoked anything, no rebalance.

Both end with the exactly-once proof: read_committed, every request exactly one answer.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

from sie.streams.eos import StopRequest
from tests.control.rollout.test_rollout_kafka import Load
from tests.support.cluster_harness import ResultTail
from tests.support.helpers import wait_until
from tests.support.scorer_fixtures import (
    ALLOWED_MODULES,
    LoggedProcess,
    ScorerThread,
    echo_spec,
    group_assignment,
    prove_exactly_once,
    topics_for,
)

pytestmark = pytest.mark.kafka

SESSION_MS = 10_000  # ScorerConfig's default: what a static member's partitions waited after a planned stop
PARTITIONS = 6


def test_a_scorer_stopped_on_purpose_hands_its_partitions_over_far_within_the_session_timeout(kafka_settings):
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=PARTITIONS)
    t = spec.topics
    tail = ResultTail(kafka_settings, {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters})
    static = {"static_membership": True, "session_timeout_ms": SESSION_MS}
    a = ScorerThread(kafka_settings, spec, instance="a", **static)
    b = ScorerThread(kafka_settings, spec, instance="b", stop=StopRequest(), **static)
    load = None
    try:
        assert a.ready.wait(60) and b.ready.wait(60)
        a_id, b_id = a.config.transactional_id, b.config.transactional_id
        wait_until(lambda: len(group_assignment(kafka_settings, spec.group_id).get(b_id, [])) > 0, 60, 0.2,
                   "both scorers own partitions")
        load = Load(kafka_settings, t.requests, rate=200)
        wait_until(lambda: tail.count() > 400, 60, 0.1, "results from both scorers")

        stopped = time.monotonic()
        b.close()  # a planned stop (SIGTERM in a worker): the batch in flight commits, the member leaves
        owns_all = wait_until(lambda: group_assignment(kafka_settings, spec.group_id).get(a_id) == list(range(PARTITIONS)),
                              SESSION_MS / 1000 * 3, 0.1, "scorer a owns every partition")
        took = time.monotonic() - stopped
        print(f"planned stop -> the other scorer owns all {PARTITIONS} partitions in {took:.2f}s "
              f"(session timeout {SESSION_MS / 1000:g}s)")
        assert owns_all and took < 4.0, f"{took:.2f}s: the partitions waited for the session timeout"
        until = time.monotonic() + 2.0
        wait_until(lambda: time.monotonic() >= until and tail.count() > 0, 10, 0.1, "results after the hand-over")
        _, per = tail.gaps(stopped, time.monotonic())
        print(f"longest gap per partition after the stop: {max(per.values()):.2f}s")
        assert max(per.values()) < 4.0, per

        ids = load.stop()
        load = None
        prove_exactly_once(kafka_settings, spec, ids, timeout=90)
    finally:
        if load is not None:
            load.stop()
        a.close()
        if b.thread.is_alive():
            b.close()
        tail.close()


def test_a_hand_over_keeps_the_membership_only_while_the_group_is_settled(kafka_settings):
    """The race tests/test_handover_e2e.py met: ``a`` owns every partition when ``b`` joins.  Cooperative-sticky
    tells ``a`` to revoke half and to join again before ``b`` is given them; until ``a`` polls, its own
    assignment still says "every partition".  A hand-over then must LEAVE: kept static membership would let the
    successor take ``a``'s place without a rebalance, with only the half ``a`` kept, and the revoked half would
    be nobody's until the next rebalance.  Settled (alone, or beside ``b`` once the rebalance finished), the
    same hand-over keeps the membership: the successor takes ``a``'s place and partitions, no rebalance."""
    import threading

    from confluent_kafka import Consumer

    from sie.kernel.clients import KafkaClients, eos_consumer_config
    from sie.streams.eos.stage import group_settled, leaves_group, owns_every_partition

    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=PARTITIONS)
    topic = spec.topics.requests
    configs = {name: eos_consumer_config(kafka_settings, spec.group_id, f"hand-over-{name}", group_instance_id=name)
               for name in ("a", "b")}
    a = Consumer(configs["a"])
    b = Consumer(configs["b"])
    stop_b = threading.Event()
    polling_b = threading.Thread(target=lambda: [b.poll(0.1) for _ in iter(stop_b.is_set, True)], daemon=True)
    handing_over = StopRequest()
    handing_over.hand_over()
    try:
        a.subscribe([topic])
        wait_until(lambda: a.poll(0.1) is None and len(a.assignment()) == PARTITIONS, 60, 0,
                   "a owns every partition")

        def settled() -> bool:
            return group_settled(a, configs["a"], KafkaClients(), [topic])

        wait_until(settled, 30, 0.1, "the broker to describe a's group as settled")
        assert not leaves_group(handing_over, settled=settled), "alone and settled: the successor takes the place"
        assert leaves_group(threading.Event(), settled=settled), "a plain stop always leaves"

        b.subscribe([topic])
        polling_b.start()  # a is not polled from here on: its revoke waits, as in a stage finishing its batch
        wait_until(lambda: len(group_assignment(kafka_settings, spec.group_id)) == 2, 60, 0.1,
                   "b in the group beside a")
        assert owns_every_partition(a, [topic]), "a's own view still says every partition (the race)"
        assert not settled()
        assert leaves_group(handing_over, settled=settled), "a rebalance in progress: a must leave"

        # a polls again: it gives up its half, the second round gives it to b, the group settles
        wait_until(lambda: a.poll(0.1) is None and settled(), 60, 0, "the group settled with a and b")
        assert 0 < len(a.assignment()) < PARTITIONS
        assert not leaves_group(handing_over, settled=settled), "settled beside b: the successor takes a's place"
    finally:
        stop_b.set()
        if polling_b.is_alive():
            polling_b.join(10)
        a.close()
        b.close()


class Worker(LoggedProcess):
    """``python -m sie.workers.worker_main`` for one replica id: the process an agent runs (static membership:
    group.instance.id = transactional.id = sie.scorer.<model>.<replica id>), without an agent."""

    def __init__(self, settings, spec_file: Path, replica_id: str, log_dir: Path) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIE_ALLOWED_MODULES": ",".join(ALLOWED_MODULES),
               "SIE_BOOTSTRAP_SERVERS": settings.bootstrap_servers, "SIE_TOPIC_PREFIX": settings.topic_prefix}
        cmd = [sys.executable, "-m", "sie.workers.worker_main", "--spec-file", str(spec_file),
               "--replica-id", replica_id, "--progress-interval", "5"]
        super().__init__(cmd, log_dir / f"worker-{replica_id}-{time.monotonic_ns()}.log", env)

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"worker exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        return "status ready" in self.output()

    def assignments(self) -> list[tuple[str, list[int]]]:
        """("assigned" | "revoked" | "lost", partitions) in the order the worker logged them."""
        return [(kind, [int(p) for p in parts.split(",") if p.strip()])
                for kind, parts in re.findall(r": (assigned|revoked|lost) \[([\d, ]*)\]", self.output())]

    def owned(self) -> list[int]:
        """The partitions it owns now: the cooperative assignor's callbacks name only what is added or taken."""
        owned: set[int] = set()
        for kind, parts in self.assignments():
            owned = owned | set(parts) if kind == "assigned" else owned - set(parts)
        return sorted(owned)


def test_a_sigkilled_worker_restarted_under_its_replica_id_takes_its_partitions_back_without_a_rebalance(
        kafka_settings, tmp_path):
    spec = echo_spec()
    topics_for(kafka_settings, spec, partitions=PARTITIONS)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec.to_document()))
    t = spec.topics
    tail = ResultTail(kafka_settings, {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters})
    a = Worker(kafka_settings, spec_file, "r-0", tmp_path)
    b = Worker(kafka_settings, spec_file, "r-1", tmp_path)
    b2 = None
    load = None
    try:
        wait_until(lambda: a.ready() and b.ready(), 90, 0.2, "both workers ready")

        def split() -> list[int] | None:
            """b's partitions once the two workers' assignments cover the topic between them."""
            owned_a, owned_b = a.owned(), b.owned()
            if owned_a and owned_b and sorted(owned_a + owned_b) == list(range(PARTITIONS)):
                return owned_b
            return None

        owned_by_b = wait_until(split, 60, 0.2, lambda: f"both workers own partitions: a {a.assignments()}, "
                                                        f"b {b.assignments()}")
        load = Load(kafka_settings, t.requests, rate=200)
        wait_until(lambda: tail.count() > 400, 60, 0.1, "results from both workers")

        before = len(a.assignments())
        killed = time.monotonic()
        b.kill()  # a crash: no LeaveGroup, the static member stays in the group
        b2 = Worker(kafka_settings, spec_file, "r-1", tmp_path)  # the agent's restart: same replica id
        wait_until(lambda: b2.owned() == owned_by_b, 60, 0.1,
                   lambda: f"the restart takes partitions {owned_by_b} back; it logged {b2.assignments()}")
        resumed = time.monotonic() - killed
        # no rebalance: the other worker never lost (or gained) anything
        assert a.assignments()[before:] == [], a.assignments()
        wait_until(lambda: tail.first_after(killed + resumed) is not None, 30, 0.1, "results after the restart")
        print(f"SIGKILL -> the restart (same group.instance.id) owns its partitions again in {resumed:.2f}s, "
              f"the other worker untouched")

        ids = load.stop()
        load = None
        prove_exactly_once(kafka_settings, spec, ids, timeout=90)
    finally:
        if load is not None:
            load.stop()
        for w in (a, b, b2):
            if w is not None:
                w.ensure_dead()
        tail.close()
