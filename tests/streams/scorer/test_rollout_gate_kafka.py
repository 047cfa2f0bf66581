"""A replica holds partitions only while it can serve every version its routing table names, on a real broker.

Two static-membership scorers of one model at a 50 % canary step (a rollout record on the rollouts topic), a
steady keyed load.  ``a`` serves both versions from the start; ``b``'s canary companion is not ready:

* ``b`` starts, reads the rollouts topic to its end and holds no partitions (it never joins) while ``a`` serves;
* its companion becomes ready: ``b`` joins and takes its share;
* its companion is lost mid-call: ``b`` refuses that batch (nothing of it produced), leaves the group with its
  in-flight commit settled, and ``a`` serves every partition; ready again, ``b`` joins again.

Then the proof over what read_committed readers see: every request answered exactly once, each by the version
its key's bucket gives at the weight of the epoch stamped on it, and no answer labelled a fallback (before, a
replica without the canary answered its bucket with the stable version: keys went back from canary to stable).
"""

from __future__ import annotations

import threading
import time
import uuid

import orjson
import pytest

from sie.control.reconcile.ports import OutRecord
from sie.control.rollout.driver import Entry
from sie.control.rollout.machine import Phase, Policy, new_rollout
from sie.kernel.admin import ensure_topics
from sie.kernel.topics import system_topics
from sie.streams.scorer.errors import VersionLost
from sie.streams.scorer.rollout import EPOCH_HEADER, InProcessVersions, weighted_table
from tests.control.rollout.test_rollout_kafka import Load, Publisher
from tests.support.cluster_harness import ResultTail
from tests.support.helpers import wait_until
from tests.support.scorer_fixtures import (
    ScorerThread,
    echo_version_spec,
    group_assignment,
    load_echo_backend,
    prove_exactly_once,
    topics_for,
)

pytestmark = pytest.mark.kafka

PARTITIONS = 6


class Gated:
    """A ``VersionProvider`` whose companion is ready only while the test says so, and can die mid-call once."""

    def __init__(self) -> None:
        self.ready = threading.Event()
        self.die_once = threading.Event()
        self.losses: list[str] = []
        self._inner = InProcessVersions(load_echo_backend)

    def backend(self, version, spec_doc):
        if not self.ready.is_set():
            return None
        inner = self._inner.backend(version, spec_doc)
        return None if inner is None else _MayDie(inner, version, self)

    def lost(self, version, detail):
        self.losses.append(detail)
        self.ready.clear()

    def retain(self, versions):
        self._inner.retain(versions)

    def report(self):
        return {"1.1.0": {"state": "ready" if self.ready.is_set() else "loading", "detail": ""}}

    def close(self):
        self._inner.close()


class _MayDie:
    def __init__(self, inner, version: str, owner: Gated) -> None:
        self._inner, self._version, self._owner = inner, version, owner

    def infer(self, rows):
        if self._owner.die_once.is_set():
            self._owner.die_once.clear()
            raise VersionLost(self._version, "its process exited (killed by SIGKILL)")
        return self._inner.infer(rows)


def canary_record(stable, canary, weight_pct: int) -> OutRecord:
    now = int(time.time() * 1000)
    policy = Policy.from_document({"steps": [weight_pct, 100], "intervalSeconds": 600})
    rollout = new_rollout(stable.name, stable.version, canary.version, policy, now).start(now).surge_ready(now)
    assert rollout.phase is Phase.CANARY and rollout.weight_bp == weight_pct * 100
    return OutRecord("rollouts", stable.name, "Rollout",
                     Entry(rollout, stable.to_document(), canary.to_document()).to_record(now))


def test_a_replica_without_every_version_ready_holds_no_partitions_and_hands_them_over_when_one_is_lost(
        kafka_settings):
    settings = kafka_settings.with_overrides(topic_prefix=f"gt{uuid.uuid4().hex[:8]}")
    ensure_topics(settings, [t for t in system_topics(settings.topic_prefix)
                             if t.name.rsplit(".", 1)[-1] in ("rollouts", "events", "specs")])
    name = f"gate-{uuid.uuid4().hex[:8]}"
    stable, canary = echo_version_spec(name, "1.0.0"), echo_version_spec(name, "1.1.0")
    topics_for(settings, stable, partitions=PARTITIONS)
    t = stable.topics
    publisher = Publisher(settings)
    record = canary_record(stable, canary, 50)
    publisher.publish([record])
    epoch = record.value["epoch"]
    tail = ResultTail(settings, {"requests": t.requests, "results": t.results, "dead_letters": t.dead_letters})
    static = {"static_membership": True, "session_timeout_ms": 6000}
    gated = Gated()
    a = ScorerThread(settings, stable, instance="a", **static)
    b = ScorerThread(settings, stable, instance="b", scorer_kwargs={"versions": gated}, **static)
    load = None
    try:
        assert a.ready.wait(60) and b.ready.wait(60)
        a_id, b_id = a.config.transactional_id, b.config.transactional_id
        load = Load(settings, t.requests, rate=200)
        wait_until(lambda: group_assignment(settings, stable.group_id).get(a_id) == list(range(PARTITIONS)), 60,
                   0.2, "a owns every partition")
        wait_until(lambda: tail.count() > 600, 90, 0.1, "a serves")
        assert b_id not in group_assignment(settings, stable.group_id), "b joined without its canary"

        gated.ready.set()  # b's companion is loaded and proven: b joins and takes its share
        wait_until(lambda: len(group_assignment(settings, stable.group_id).get(b_id, [])) > 0, 60, 0.2,
                   "b owns partitions once its canary is ready")
        served = tail.count()
        wait_until(lambda: tail.count() > served + 600, 90, 0.1, "both serve")

        gated.die_once.set()  # b's companion dies mid-call: b refuses the batch and leaves
        wait_until(lambda: gated.losses, 60, 0.1, "b's companion lost mid-call")
        left = time.monotonic()
        wait_until(lambda: group_assignment(settings, stable.group_id).get(a_id) == list(range(PARTITIONS)), 30,
                   0.2, "a owns every partition again")
        print(f"lost companion -> a owns every partition in {time.monotonic() - left:.2f}s")
        assert b_id not in group_assignment(settings, stable.group_id)
        served = tail.count()
        wait_until(lambda: tail.count() > served + 400, 90, 0.1, "a serves alone")
        gated.ready.set()
        wait_until(lambda: len(group_assignment(settings, stable.group_id).get(b_id, [])) > 0, 60, 0.2,
                   "b joins again once its canary is back")
        served = tail.count()
        wait_until(lambda: tail.count() > served + 400, 90, 0.1, "both serve again")
        ids = load.stop()
        load = None
        results, dead = prove_exactly_once(settings, stable, ids, timeout=90)
    finally:
        if load is not None:
            load.stop()
        a.close()
        b.close()
        tail.close()
        publisher.close()
    assert not dead
    table = weighted_table(("1.0.0", None), ("1.1.0", None), publisher.weights[epoch])
    by_version: dict[str, int] = {}
    for m in results:
        headers = dict(m.headers() or [])
        doc = orjson.loads(m.value())
        assert int(headers[EPOCH_HEADER]) == epoch and "sie.routing.fallback" not in headers, headers
        assert doc["version"] == table.route(m.key(), str(doc["id"])).version, (doc, m.key())
        by_version[doc["version"]] = by_version.get(doc["version"], 0) + 1
    assert set(by_version) == {"1.0.0", "1.1.0"}, by_version
    assert b.summary is not None and b.summary.records_in > 0, "b served once its canary was ready"
