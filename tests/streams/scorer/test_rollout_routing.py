"""Rollout weights in the scorer: monotone key stickiness (a property), applied per batch, epoch-stamped."""

from __future__ import annotations

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sie.kernel.settings import Settings
from sie.streams.scorer import BUCKETS, RoutingTable, ScorerConfig
from sie.streams.scorer.errors import VersionLost, VersionsNotReady
from sie.streams.scorer.rollout import (
    EPOCH_HEADER,
    InProcessVersions,
    RolloutScorer,
    WeightSet,
    weighted_table,
)
from tests.fakes.kafka_clients import FakeMessage
from tests.support.scorer_fixtures import echo_spec

STABLE, CANARY = ("1.0.0", "stable-backend"), ("1.1.0", "canary-backend")

keys = st.lists(st.binary(min_size=1, max_size=16), min_size=1, max_size=60, unique=True)
weights = st.lists(st.integers(0, BUCKETS), min_size=1, max_size=8).map(sorted)


@settings(max_examples=200, deadline=None)
@given(keys, weights)
def test_a_key_only_moves_stable_to_canary_as_the_weight_rises(ks, rising):
    """Monotone stickiness: once a key is on the canary, every higher weight keeps it there."""
    on_canary: set[bytes] = set()
    for w in rising:
        table = weighted_table(STABLE, CANARY, w)
        now = {k for k in ks if table.route(k, "unused").version == CANARY[0]}
        assert on_canary <= now, f"keys moved back to stable at {w} bp: {on_canary - now}"
        on_canary = now
    # rollback: weight 0 sends every key back to stable
    assert {weighted_table(STABLE, CANARY, 0).route(k, "x").version for k in ks} == {STABLE[0]}


@settings(max_examples=100, deadline=None)
@given(st.integers(0, BUCKETS))
def test_the_canary_share_of_buckets_is_the_weight_exactly(w):
    table = weighted_table(STABLE, CANARY, w)
    bounds = [e.weight for e in table.entries]
    assert (bounds[-1] if table.versions[-1] == CANARY[0] else 0) == w


def test_requests_without_a_key_route_by_id():
    table = weighted_table(STABLE, CANARY, 5000)
    versions = {table.route(None, f"id-{i}").version for i in range(200)}
    assert versions == {STABLE[0], CANARY[0]}
    assert table.route(None, "id-7").version == table.route(None, "id-7").version


# --- the scorer applies the newest weight set at the batch boundary ----------------------------------

class Source:
    def __init__(self) -> None:
        self.record: dict | None = None
        self.behind = False

    def latest(self):
        return self.record

    def close(self) -> None:
        pass


class Backend:
    def __init__(self, version: str, factor: float) -> None:
        self.version, self.factor, self.closed = version, factor, False

    def infer(self, rows):
        return [{"y": r["x"] * self.factor} for r in rows]

    def close(self) -> None:
        self.closed = True


def record(spec, canary_doc, phase: str, weight: int, epoch: int) -> dict:
    return {"model": spec.name, "stable_version": "1.0.0", "canary_version": "1.1.0", "phase": phase,
            "step": 0, "weight_bp": weight, "epoch": epoch, "stable_spec_json": json.dumps(spec.to_document()),
            "canary_spec_json": json.dumps(canary_doc)}


def make_scorer():
    spec = echo_spec()
    canary_doc = {**spec.to_document(), "version": "1.1.0"}
    loaded: list[str] = []

    def factory(s):
        loaded.append(s.version)
        return Backend(s.version, 3.0)

    source = Source()
    config = ScorerConfig(settings=Settings(), spec=spec, instance="t-0")
    scorer = RolloutScorer(config, RoutingTable.single("1.0.0", Backend("1.0.0", 2.0)), weights=source,
                           versions=InProcessVersions(factory))
    return scorer, source, spec, canary_doc, loaded


def batch(spec, n: int) -> list[FakeMessage]:
    return [FakeMessage(spec.topics.requests, 0, i, f"k{i}".encode(), orjson.dumps({"id": f"r{i}", "inputs": {"x": 1}}))
            for i in range(n)]


def answered(prepared) -> dict[str, tuple[str, bytes]]:
    out = {}
    for o in prepared.outputs:
        doc = orjson.loads(o.value)
        out[doc["id"]] = (doc["version"], dict(o.headers or [])[EPOCH_HEADER])
    return out


def test_no_rollout_no_stamp_and_the_own_version_answers():
    scorer, _source, spec, _doc, loaded = make_scorer()
    prepared = scorer.prepare(batch(spec, 5))
    assert {orjson.loads(o.value)["version"] for o in prepared.outputs} == {"1.0.0"}
    assert all(not o.headers for o in prepared.outputs) and loaded == []


def test_weights_apply_per_batch_and_each_result_names_its_version_and_epoch():
    scorer, source, spec, canary_doc, loaded = make_scorer()
    source.record = record(spec, canary_doc, "Surging", 0, 0)
    first = answered(scorer.prepare(batch(spec, 200)))
    assert loaded == ["1.1.0"]  # the canary is loaded while it still has 0 %: before any traffic
    assert {v for v, _e in first.values()} == {"1.0.0"}
    source.record = record(spec, canary_doc, "Canary", 5000, 3)
    second = answered(scorer.prepare(batch(spec, 200)))
    table = weighted_table(("1.0.0", None), ("1.1.0", None), 5000)
    for i in range(200):
        version, epoch = second[f"r{i}"]
        assert epoch == b"3" and version == table.route(f"k{i}".encode(), "").version
    assert {v for v, _ in second.values()} == {"1.0.0", "1.1.0"}
    source.record = record(spec, canary_doc, "RolledBack", 0, 4)
    third = answered(scorer.prepare(batch(spec, 200)))
    assert {v for v, _ in third.values()} == {"1.0.0"} and {e for _, e in third.values()} == {b"4"}
    assert scorer.routing.versions == ("1.0.0",)


def test_complete_serves_only_the_new_version_without_reloading_the_old():
    scorer, source, spec, canary_doc, loaded = make_scorer()
    source.record = record(spec, canary_doc, "Complete", BUCKETS, 4)
    got = answered(scorer.prepare(batch(spec, 50)))
    assert {v for v, _ in got.values()} == {"1.1.0"} and loaded == ["1.1.0"]


def test_a_record_for_another_model_is_ignored():
    scorer, source, spec, canary_doc, loaded = make_scorer()
    source.record = {**record(spec, canary_doc, "Canary", 5000, 1), "model": "other"}
    scorer.prepare(batch(spec, 3))
    assert loaded == [] and scorer.epoch == 0


def test_weight_set_rejects_a_weight_out_of_range():
    import pytest

    spec = echo_spec()
    with pytest.raises(ValueError, match="weight_bp must be in"):
        WeightSet.from_record(record(spec, spec.to_document(), "Canary", BUCKETS + 1, 1))


def test_a_finished_rollout_between_other_versions_is_ignored():
    """A replica of a version applied after the rollout (no rollout block) serves its own version only."""
    from sie.streams.scorer.rollout import RolloutScorer

    spec = echo_spec()
    own = spec.model_copy(update={"version": "1.2.0"})
    source = Source()
    loaded: list[str] = []
    scorer = RolloutScorer(ScorerConfig(settings=Settings(), spec=own, instance="t-1"),
                           RoutingTable.single("1.2.0", Backend("1.2.0", 2.0)), weights=source,
                           versions=InProcessVersions(lambda s: loaded.append(s.version) or Backend(s.version, 3.0)))
    source.record = record(spec, {**spec.to_document(), "version": "1.1.0"}, "Complete", BUCKETS, 3)
    prepared = scorer.prepare(batch(spec, 20))
    assert {orjson.loads(o.value)["version"] for o in prepared.outputs} == {"1.2.0"}
    assert loaded == [] and all(not o.headers for o in prepared.outputs)


# --- a version the table names that is not ready here: the replica serves nothing (it holds no partitions) ---

class Companions:
    """A ``VersionProvider`` whose companion is ready only when the test says so."""

    def __init__(self, backend, version: str = "1.1.0") -> None:
        self.companion = backend
        self.version = version
        self.ready = False
        self.asked: list[str] = []
        self.losses: list[tuple[str, str]] = []
        self.retained: set[str] = set()

    def backend(self, version, spec_doc):
        self.asked.append(version)
        return self.companion if self.ready else None

    def lost(self, version, detail):
        self.losses.append((version, detail))
        self.ready = False

    def retain(self, versions):
        self.retained = set(versions)

    def report(self):
        return {self.version: {"state": "ready" if self.ready else "loading", "detail": ""}}

    def close(self):
        pass


class Dies:
    def infer(self, rows):
        raise VersionLost("1.1.0", "its process exited (killed by SIGKILL)")


def with_companions(companion, own: str = "1.0.0", other: str = "1.1.0"):
    spec = echo_spec()
    canary_doc = {**spec.to_document(), "version": "1.1.0"}
    own_spec = spec.model_copy(update={"version": own})
    source, versions = Source(), Companions(companion, other)
    scorer = RolloutScorer(ScorerConfig(settings=Settings(), spec=own_spec, instance="t-2"),
                           RoutingTable.single(own, Backend(own, 2.0)), weights=source, versions=versions)
    return scorer, source, versions, spec, canary_doc


def test_a_canary_not_loaded_here_makes_the_replica_refuse_its_batches_until_it_is():
    """A restarted stable replica whose canary companion still loads must not answer the canary's bucket with
    the stable version (a key the canary answered would go back): it serves nothing until the canary is ready."""
    scorer, source, versions, spec, canary_doc = with_companions(Backend("1.1.0", 3.0))
    source.record = record(spec, canary_doc, "Canary", 5000, 2)
    assert not scorer.serving() and "1.1.0 not ready here (loading)" in scorer.unready
    with pytest.raises(VersionsNotReady, match="1.1.0 not ready here"):
        scorer.prepare(batch(spec, 200))
    assert versions.retained == {"1.1.0"}
    versions.ready = True  # loaded and proven: the replica may hold partitions again
    assert scorer.serving()
    got = answered(scorer.prepare(batch(spec, 200)))
    table = weighted_table(("1.0.0", None), ("1.1.0", None), 5000)
    for i in range(200):
        assert got[f"r{i}"] == (table.route(f"k{i}".encode(), "").version, b"2")


def test_a_surge_replica_never_answers_the_stable_share_with_its_own_new_version():
    """Surging (weight 0): the surge replica runs the canary as its own version; until its stable companion is
    ready it serves nothing (before: it answered stable's share with the canary, labelled a fallback)."""
    scorer, source, versions, spec, canary_doc = with_companions(Backend("1.0.0", 2.0), own="1.1.0", other="1.0.0")
    source.record = record(spec, canary_doc, "Surging", 0, 1)
    assert not scorer.serving()
    with pytest.raises(VersionsNotReady, match="1.0.0 not ready here"):
        scorer.prepare(batch(spec, 50))
    versions.ready = True
    assert scorer.serving()
    assert {v for v, _e in answered(scorer.prepare(batch(spec, 50))).values()} == {"1.0.0"}


def test_a_stable_replica_serves_in_surging_while_its_canary_companion_loads():
    """Weight 0: the table names only the stable version, so a stable replica keeps its partitions while the
    canary loads next to it (else every replica would leave when a rollout starts)."""
    scorer, source, versions, spec, canary_doc = with_companions(Backend("1.1.0", 3.0))
    source.record = record(spec, canary_doc, "Surging", 0, 1)
    assert scorer.serving() and versions.asked == ["1.1.0"]  # asked for: it loads at weight 0
    assert {v for v, _e in answered(scorer.prepare(batch(spec, 50))).values()} == {"1.0.0"}


def test_a_companion_lost_mid_batch_refuses_the_batch_and_the_replica_until_it_is_back():
    scorer, source, versions, spec, canary_doc = with_companions(Dies())
    versions.ready = True
    source.record = record(spec, canary_doc, "Canary", 5000, 2)
    assert scorer.serving()
    with pytest.raises(VersionsNotReady, match="its process exited"):
        scorer.prepare(batch(spec, 100))  # nothing of the batch is produced: its rows come again elsewhere
    assert versions.losses == [("1.1.0", "its process exited (killed by SIGKILL)")]
    assert not scorer.serving()
    versions.companion, versions.ready = Backend("1.1.0", 3.0), True  # restarted, loaded and proven again
    assert scorer.serving()
    assert {v for v, _e in answered(scorer.prepare(batch(spec, 100))).values()} == {"1.0.0", "1.1.0"}


def test_a_replica_decides_only_once_it_read_the_rollouts_topic_to_its_end():
    scorer, source, versions, spec, canary_doc = with_companions(Backend("1.1.0", 3.0))
    source.behind = True
    source.caught_up = lambda: not source.behind  # type: ignore[attr-defined]
    assert not scorer.serving()  # a view it knows is stale: it does not join yet
    source.record = record(spec, canary_doc, "Canary", 5000, 2)
    source.behind = False
    assert not scorer.serving() and "1.1.0 not ready here" in scorer.unready


def test_in_process_versions_never_raise_a_load_failure_into_the_batch():
    def factory(s):
        raise RuntimeError("no such callable")

    versions = InProcessVersions(factory)
    assert versions.backend("1.1.0", {**echo_spec().to_document(), "version": "1.1.0"}) is None
    assert versions.report() == {"1.1.0": {"state": "failed", "detail": "RuntimeError: no such callable"}}


@pytest.mark.parametrize(("own", "other", "phase", "weight", "serves_before_companion"), [
    ("1.0.0", "1.1.0", "Pending", 0, True),          # a stable replica restarted: weight 0 names stable alone
    ("1.0.0", "1.1.0", "Surging", 0, True),
    ("1.0.0", "1.1.0", "Canary", 1000, False),       # ... a canary step names both
    ("1.0.0", "1.1.0", "Paused", 1000, False),
    ("1.0.0", "1.1.0", "Promoting", BUCKETS, False),  # ... 100 % names the canary alone
    ("1.0.0", "1.1.0", "Draining", BUCKETS, False),
    ("1.0.0", "1.1.0", "RollingBack", 0, True),
    ("1.1.0", "1.0.0", "Surging", 0, False),          # the surge replica: its own version is the canary
    ("1.1.0", "1.0.0", "Canary", 5000, False),
    ("1.1.0", "1.0.0", "Draining", BUCKETS, True),    # ... at 100 % its own version is all it needs
    ("1.1.0", "1.0.0", "RollingBack", 0, False),      # ... rolled back: stable's share needs its companion
    ("1.1.0", "1.0.0", "Complete", BUCKETS, True),
])
def test_a_restarted_replica_serves_in_every_phase_only_once_every_version_its_table_names_is_ready(
        own, other, phase, weight, serves_before_companion):
    scorer, source, versions, spec, canary_doc = with_companions(Backend(other, 3.0), own=own, other=other)
    source.record = record(spec, canary_doc, phase, weight, 3)
    assert scorer.serving() is serves_before_companion, scorer.unready
    versions.ready = True
    assert scorer.serving()
    table = weighted_table(("1.0.0", None), ("1.1.0", None), 0 if phase == "RollingBack" else weight)
    for rid, (version, epoch) in answered(scorer.prepare(batch(spec, 100))).items():
        assert epoch == b"3" and version == table.route(f"k{rid[1:]}".encode(), "").version


class CatchingUp(Source):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def refresh(self) -> None:
        self.calls.append("refresh")

    def wait_caught_up(self, limit_s: float) -> bool:
        self.calls.append("wait")
        return True


def test_newly_assigned_partitions_are_scored_only_after_the_rollouts_topic_is_read_to_its_end():
    """Their previous owner may have answered a key with the canary under a newer epoch than this replica
    has read: reading to the end first means no key is answered under an older, lower weight here."""
    spec = echo_spec()
    source = CatchingUp()
    scorer = RolloutScorer(ScorerConfig(settings=Settings(), spec=spec, instance="t-3"),
                           RoutingTable.single("1.0.0", Backend("1.0.0", 2.0)), weights=source,
                           versions=InProcessVersions(lambda s: Backend(s.version, 3.0)))

    from confluent_kafka import KafkaException

    class Consumer:
        def list_topics(self, *_a, **_k):
            raise KafkaException("no metadata in this test")

    scorer.partitions_assigned(Consumer(), [])
    assert source.calls == ["refresh", "wait"]


def test_a_rollout_record_is_decoded_once_not_at_every_batch(monkeypatch):
    from sie.streams.scorer import rollout as rollout_module

    scorer, source, spec, canary_doc, loaded = make_scorer()
    decoded: list[int] = []
    real = WeightSet.from_record

    def counting(rec):
        decoded.append(rec["epoch"])
        return real(rec)

    monkeypatch.setattr(rollout_module.WeightSet, "from_record", staticmethod(counting))
    source.record = record(spec, canary_doc, "Canary", 5000, 3)
    for _ in range(4):
        got = answered(scorer.prepare(batch(spec, 20)))
        assert {e for _v, e in got.values()} == {b"3"}
    assert decoded == [3] and loaded == ["1.1.0"]
    source.record = record(spec, canary_doc, "Canary", 10_000, 4)  # a new record: decoded once more
    assert {v for v, _e in answered(scorer.prepare(batch(spec, 20))).values()} == {"1.1.0"}
    scorer.prepare(batch(spec, 20))
    assert decoded == [3, 4]
