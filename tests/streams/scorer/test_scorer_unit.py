"""Scorer unit tests: codec, routing, dead-letter headers, poison classification and the
transaction/recovery logic of the run loop against fake Kafka clients (no broker)."""

from __future__ import annotations

import threading
from collections import Counter

import orjson
import pytest
from confluent_kafka import KafkaError

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.streams.eos.deadletter import dead_letter_headers
from sie.streams.scorer import (
    BUCKETS,
    Codec,
    DeadLetterReason,
    Poison,
    RouteEntry,
    RoutingTable,
    Scorer,
    ScorerConfig,
)
from tests.fakes.kafka_clients import NOW_MS, FakeConsumer, FakeMessage, FakeProducer, fake_clients, kafka_error
from tests.support.scorer_fixtures import POISON_X, echo, echo_spec


def make_codec(max_bytes: int = 1024, depth: int = 8) -> Codec:
    from sie.schemas.validation import compile_validator

    return Codec("echo", compile_validator(echo_spec().input_schema), max_bytes, depth)


def parse(codec: Codec, value: bytes | None, key: bytes | None = None, offset: int = 7):
    return codec.parse("req", 3, offset, key, value, NOW_MS)


# --- codec ---------------------------------------------------------------------------------------

def test_missing_id_defaults_to_topic_partition_offset():
    req = parse(make_codec(), b'{"inputs": {"x": 1}}', offset=42)
    assert req.id == "req:3:42"
    assert req.inputs == {"x": 1.0}


def test_integer_id_becomes_string_and_extra_keys_pass_through():
    codec = make_codec()
    req = parse(codec, b'{"id": 17, "inputs": {"x": 2.5}, "metadata": {"trace": "t1"}, "tenant": "acme"}', b"k1")
    value = orjson.loads(codec.result(req, "1.0.0", {"y": 5.0}, 12.5, 3.25, 64))
    assert value == {
        "id": "17", "model": "echo", "version": "1.0.0", "status": "ok", "outputs": {"y": 5.0},
        "source": {"topic": "req", "partition": 3, "offset": 7},
        "timings": {"queue_ms": 12.5, "inference_ms": 3.25, "batch_size": 64},
        "metadata": {"trace": "t1"}, "tenant": "acme",
    }


def test_expired_result_says_why_and_keeps_metadata():
    codec = make_codec()
    req = parse(codec, b'{"id": "a", "inputs": {"x": 1}, "metadata": {"m": 1}}')
    value = orjson.loads(codec.expired(req, "1.0.0", 31_000.0, 30_000))
    assert value["status"] == "expired" and value["outputs"] is None
    assert "31000 ms > sla.max_queue_time_ms 30000" in value["error"]
    assert value["metadata"] == {"m": 1} and value["id"] == "a"


DEEP = b'{"inputs": {"x": 1}, "metadata": ' + b"[" * 20 + b"]" * 20 + b"}"


@pytest.mark.parametrize("value, reason, detail", [
    (None, DeadLetterReason.INVALID_JSON, "value: empty"),
    (b"", DeadLetterReason.INVALID_JSON, "value: empty"),
    (b'{"inputs": {"x": 1}, "pad": "' + b"a" * 2000 + b'"}', DeadLetterReason.TOO_LARGE, "bytes > max_request_bytes 1024"),
    (b'{"inputs": {"x": 1}', DeadLetterReason.INVALID_JSON, "value: not valid JSON"),
    (b'{"inputs": {"x": NaN}}', DeadLetterReason.INVALID_JSON, "value: not valid JSON"),
    (b'{"inputs": {"x": Infinity}}', DeadLetterReason.INVALID_JSON, "value: not valid JSON"),
    (b"\xff\xfe\x00garbage", DeadLetterReason.INVALID_JSON, "value: not valid JSON"),
    (b"[1, 2]", DeadLetterReason.SCHEMA_VIOLATION, "request: must be a JSON object (got array)"),
    (b'"text"', DeadLetterReason.SCHEMA_VIOLATION, "request: must be a JSON object (got string)"),
    (DEEP, DeadLetterReason.SCHEMA_VIOLATION, "> max_json_depth 8"),
    (b'{"id": "a"}', DeadLetterReason.SCHEMA_VIOLATION, "inputs: required JSON object (missing)"),
    (b'{"inputs": [1]}', DeadLetterReason.SCHEMA_VIOLATION, "inputs: required JSON object (got array)"),
    (b'{"inputs": {"x": "abc"}}', DeadLetterReason.SCHEMA_VIOLATION, "inputs.x: must be a number"),
    (b'{"inputs": {}}', DeadLetterReason.SCHEMA_VIOLATION, "inputs.x: required field missing"),
    (b'{"inputs": {"x": 1, "z": 2}}', DeadLetterReason.SCHEMA_VIOLATION, "inputs.z"),
    (b'{"id": [1], "inputs": {"x": 1}}', DeadLetterReason.SCHEMA_VIOLATION, "id: must be a non-empty string"),
    (b'{"id": true, "inputs": {"x": 1}}', DeadLetterReason.SCHEMA_VIOLATION, "id: must be a non-empty string"),
    (b'{"inputs": {"x": 1}, "status": "ok"}', DeadLetterReason.SCHEMA_VIOLATION, "request.status: reserved"),
])
def test_poison_is_classified_with_a_detail_naming_the_field(value, reason, detail):
    verdict = parse(make_codec(), value)
    assert isinstance(verdict, Poison), verdict
    assert verdict.reason is reason
    assert detail in verdict.detail


def test_dead_letter_headers_name_source_model_version_and_drop_stale_sie_headers():
    codec = make_codec()
    headers = dead_letter_headers(DeadLetterReason.SCHEMA_VIOLATION.value, "inputs.x: must be a number",
                                  "req", 3, 7, [("trace", b"t"), ("sie.reason", b"old")],
                                  codec.dead_letter_tags("1.0.0"))
    assert headers == [
        ("trace", b"t"),
        ("sie.reason", b"schema_violation"), ("sie.detail", b"inputs.x: must be a number"),
        ("sie.source.topic", b"req"), ("sie.source.partition", b"3"), ("sie.source.offset", b"7"),
        ("sie.model", b"echo"), ("sie.version", b"1.0.0"),
    ]


# --- routing -------------------------------------------------------------------------------------

def test_routing_is_deterministic_and_respects_weights():
    table = RoutingTable((RouteEntry("1", 9_000, "a"), RouteEntry("2", 1_000, "b")))
    keys = [f"entity-{i}".encode() for i in range(20_000)]
    first = [table.route(k, "ignored").version for k in keys]
    assert first == [table.route(k, "other").version for k in keys]  # key wins over id, stable
    share = Counter(first)["2"] / len(keys)
    assert 0.08 < share < 0.12
    # without a key the request id decides
    assert table.route(None, "r-1").version == table.route(b"", "r-1").version


def test_zero_weight_version_gets_nothing_and_single_table_gets_everything():
    table = RoutingTable((RouteEntry("old", 0, None), RouteEntry("new", BUCKETS, None)))
    assert {table.route(str(i).encode(), "x").version for i in range(2_000)} == {"new"}
    assert RoutingTable.single("1.0.0", None).route(None, "any").version == "1.0.0"


@pytest.mark.parametrize("entries, message", [
    ((), "at least one version"),
    ((RouteEntry("1", 5_000, None),), "sum to 10000"),
    ((RouteEntry("1", 5_000, None), RouteEntry("1", 5_000, None)), "unique"),
    ((RouteEntry("1", -1, None), RouteEntry("2", 10_001, None)), ">= 0"),
])
def test_bad_routing_tables_are_rejected(entries, message):
    with pytest.raises(ConfigError, match=message):
        RoutingTable(entries)


def test_config_rejects_bad_values_naming_the_field():
    with pytest.raises(ConfigError, match="scorer.max_batch: must be >= 1"):
        ScorerConfig(settings=Settings(), spec=echo_spec(), instance="i", max_batch=0)
    with pytest.raises(ConfigError, match="scorer.instance"):
        ScorerConfig(settings=Settings(), spec=echo_spec(), instance="a b")
    cfg = ScorerConfig(settings=Settings(), spec=echo_spec("echo-x"), instance="host-1")
    assert cfg.transactional_id == "sie.scorer.echo-x.host-1"
    assert cfg.consumer_config()["isolation.level"] == "read_committed"
    assert cfg.consumer_config()["enable.auto.commit"] is False
    assert cfg.producer_config()["transactional.id"] == "sie.scorer.echo-x.host-1"


def test_a_partition_move_never_stops_the_others_and_a_cut_off_transaction_ends_with_the_session():
    """Issue 27 (the partition campaign, docs/reliability.md): the cooperative assignor revokes only what moves; the
    open transaction of a scorer cut off from the brokers is aborted about one session timeout after it began;
    a request stuck on a connection that lost packets is retried on a fresh one within 10 s."""
    cfg = ScorerConfig(settings=Settings(), spec=echo_spec("echo-x"), instance="host-1", session_timeout_ms=12_000)
    consumer, producer = cfg.consumer_config(), cfg.producer_config()
    assert consumer["partition.assignment.strategy"] == "cooperative-sticky"
    assert producer["transaction.timeout.ms"] == 12_000 == consumer["session.timeout.ms"]
    assert consumer["socket.timeout.ms"] == 10_000 and consumer["reconnect.backoff.max.ms"] == 2000
    short = ScorerConfig(settings=Settings(), spec=echo_spec("echo-x"), instance="h", session_timeout_ms=6000)
    assert short.producer_config()["transaction.timeout.ms"] == 10_000  # the floor (clients.eos_transaction_...)
    assert short.producer_config()["socket.timeout.ms"] == 9900  # librdkafka: >= 100 ms below the transaction's
    explicit = ScorerConfig(settings=Settings(), spec=echo_spec("echo-x"), instance="h", transaction_timeout_ms=30_000)
    assert explicit.producer_config()["transaction.timeout.ms"] == 30_000
    assert explicit.producer_config()["socket.timeout.ms"] == 10_000
    with pytest.raises(ConfigError, match="scorer.transaction_timeout_ms"):
        ScorerConfig(settings=Settings(), spec=echo_spec(), instance="i", transaction_timeout_ms=10)


def test_static_membership_uses_the_transactional_id_as_group_instance_id():
    dynamic = ScorerConfig(settings=Settings(), spec=echo_spec("echo-x"), instance="r-0")
    assert "group.instance.id" not in dynamic.consumer_config()  # sie score: dynamic members leave on close
    static = ScorerConfig(settings=Settings(), spec=echo_spec("echo-x"), instance="r-0", static_membership=True)
    assert static.consumer_config()["group.instance.id"] == static.transactional_id == "sie.scorer.echo-x.r-0"


# --- run loop against fake clients -----------------------------------------------------------------

class FlakyBackend:
    """echo, but fails the next ``outage`` calls whatever the rows (a transient outage)."""

    def __init__(self, outage: int = 0) -> None:
        self.outage = outage
        self.calls = 0

    def infer(self, rows):
        self.calls += 1
        if self.outage > 0:
            self.outage -= 1
            raise RuntimeError("CUDA error: device busy")
        return echo(rows)


def run_fake(values, backend=None, faults=None, max_batch=100, spec=None, ts=NOW_MS, pipelined=True,
             consumer_class=FakeConsumer, metrics=None):
    """The scorer over one partition of ``values``; it is stopped once every record is committed."""
    spec = spec or echo_spec()
    stop = threading.Event()
    topic = spec.topics.requests
    consumer = consumer_class(
        [FakeMessage(topic, 0, i, f"k{i}".encode(), v, ts) for i, v in enumerate(values)],
        # no metadata: results are partitioned by key
        faults={"list_topics": kafka_error(KafkaError._TRANSPORT)},
        on_idle=lambda c: stop.set() if c.committed_offsets.get((topic, 0)) == len(values) else None)
    producers: list[FakeProducer] = []

    def make_producer(_cfg):
        producers.append(FakeProducer(faults, consumer=consumer))  # one script of faults for all of them
        return producers[-1]

    config = ScorerConfig(settings=Settings(), spec=spec, instance="test-0", max_batch=max_batch, max_wait_ms=0,
                          retry_backoff_s=0.0, pipelined=pipelined)
    scorer = Scorer(config, RoutingTable.single(spec.version, backend or FlakyBackend()),
                    clients=fake_clients(consumer=consumer, producer=make_producer).clients, metrics=metrics)
    summary = scorer.run(stop)
    visible = [t for p in producers for t in p.visible]
    return summary, visible, consumer, producers, scorer, spec


def by_topic(visible, topic):
    return [t for t in visible if t[0] == topic]


def req(i: int, x: float | None = None) -> bytes:
    return orjson.dumps({"id": f"r{i}", "inputs": {"x": float(i) if x is None else x}})


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "serial"])
def test_each_request_gets_one_result_and_offsets_are_last_plus_one(pipelined):
    summary, visible, consumer, producers, scorer, spec = run_fake([req(i) for i in range(250)], max_batch=100, pipelined=pipelined)
    results = [orjson.loads(v) for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert [r["id"] for r in results] == [f"r{i}" for i in range(250)]
    assert all(r["outputs"] == {"y": 2.0 * i} for i, r in enumerate(results))
    assert [k for _t, _v, k, _h in by_topic(visible, spec.topics.results)][:2] == [b"k0", b"k1"]  # key kept
    assert producers[0].commits == 3 and consumer.committed_offsets[(spec.topics.requests, 0)] == 250
    assert summary.results == 250 and summary.dead_letters == 0
    mid = {"model_id": spec.name}  # the name: a model keeps its series across versions
    unified = {**mid, "service_type": "scoring", "priority_level": "P1", "version": spec.version}
    assert scorer.metrics.value("sie_records_out_total", {**mid, "status": "ok"}) == 250
    assert scorer.metrics.value("sie_txn_commit_seconds_count", mid) == 3
    assert scorer.metrics.value("sie_inference_latency_seconds_count", unified) == 3
    # one per-request observation per result, each at least its queue time
    assert scorer.metrics.value("sie_request_latency_seconds_count", unified) == 250


def test_poison_row_is_isolated_and_only_it_is_dead_lettered():
    values = [req(i) for i in range(10)]
    values[4] = req(4, x=POISON_X)
    values[7] = b"{not json"
    summary, visible, *_rest, spec = run_fake(values)
    dlq = by_topic(visible, spec.topics.dead_letters)
    assert sorted(dict(h)["sie.reason"] for _t, _v, _k, h in dlq) == [b"inference_error", b"invalid_json"]
    poison = next(d for d in dlq if dict(d[3])["sie.reason"] == b"inference_error")
    assert poison[1] == values[4] and poison[2] == b"k4"  # original bytes unchanged
    assert b"cannot score" in dict(poison[3])["sie.detail"]
    assert len(by_topic(visible, spec.topics.results)) == 8
    assert summary.dead_letters == 2


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "serial"])
def test_transient_outage_is_retried_not_dead_lettered(pipelined):
    backend = FlakyBackend(outage=40)  # fails every call of the first batch, bisection and probe included
    summary, visible, consumer, producers, _s, spec = run_fake([req(i) for i in range(8)], backend=backend, pipelined=pipelined)
    assert by_topic(visible, spec.topics.dead_letters) == []
    assert sorted(orjson.loads(v)["id"] for _t, v, _k, _h in by_topic(visible, spec.topics.results)) == \
        sorted(f"r{i}" for i in range(8))
    seeks = [c.args[2] for c in consumer.called("seek")]
    # found while preparing: no transaction was opened, only the consumer went back to the first record
    assert summary.aborts == 0 and seeks and seeks[0] == 0


def test_a_backend_outage_is_reported_while_it_lasts_and_ends_with_the_first_scored_batch():
    """What the worker forwards to its agent (and the control plane shows as Degraded): the outage from the
    first retried batch, with the failure, until a batch scores again."""
    from sie.streams.scorer.metrics import ScorerMetrics

    spec = echo_spec()
    metrics = ScorerMetrics.for_spec(spec)
    seen_when_back = []

    class Recovering(FlakyBackend):
        def infer(self, rows):
            if self.outage == 0 and not seen_when_back:
                seen_when_back.append((metrics.outage(), metrics.value("sie_backend_outage", {"model_id": spec.name})))
            return super().infer(rows)

    assert metrics.outage() is None
    summary, visible, *_rest = run_fake([req(i) for i in range(8)], backend=Recovering(outage=40), spec=spec,
                                        metrics=metrics)
    outage, gauge = seen_when_back[0]
    assert outage is not None and "CUDA error: device busy" in outage["detail"] and outage["since_ms"] > 0
    assert gauge == 1
    assert metrics.outage() is None and metrics.value("sie_backend_outage", {"model_id": spec.name}) == 0
    assert metrics.value("sie_backend_outages_total", {"model_id": spec.name}) >= 1
    assert summary.results == 8 and summary.dead_letters == 0


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "serial"])
def test_abortable_commit_rewinds_to_committed_offset_and_rescores_once(pipelined):
    faults = {"commit_transaction": [kafka_error(KafkaError._STATE, txn_requires_abort=True)]}
    summary, visible, consumer, producers, _s, spec = run_fake([req(i) for i in range(30)], faults=faults,
                                                                max_batch=10, pipelined=pipelined)
    ids = [orjson.loads(v)["id"] for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(30))  # none missing, none twice
    assert summary.aborts == 1 and producers[0].aborts == 1


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "serial"])
def test_fatal_commit_recreates_the_producer_and_keeps_exactly_once(pipelined):
    faults = {"commit_transaction": [kafka_error(KafkaError._FENCED, fatal=True)]}
    summary, visible, consumer, producers, _s, spec = run_fake([req(i) for i in range(30)], faults=faults,
                                                                max_batch=10, pipelined=pipelined)
    ids = [orjson.loads(v)["id"] for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(30))
    assert len(producers) == 2 and summary.producer_restarts == 1


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "serial"])
def test_retriable_commit_error_is_retried_in_place(pipelined):
    faults = {"commit_transaction": [kafka_error(KafkaError._TIMED_OUT, retriable=True)]}
    summary, visible, consumer, producers, _s, spec = run_fake([req(i) for i in range(5)], faults=faults, pipelined=pipelined)
    assert len(by_topic(visible, spec.topics.results)) == 5
    assert summary.aborts == 0 and producers[0].commits == 1


def test_old_requests_get_an_expired_result():
    spec = echo_spec(max_queue_time_ms=1_000)
    summary, visible, *_rest = run_fake([req(1)], spec=spec, ts=1)  # timestamp in 1970
    (result,) = [orjson.loads(v) for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert result["status"] == "expired" and summary.expired == 1


def test_set_routing_switches_version_between_batches():
    spec = echo_spec()
    summary, visible, consumer, producers, scorer, _spec = run_fake([req(1)], spec=spec)
    table = RoutingTable((RouteEntry("1.0.0", 0, None), RouteEntry("2.0.0", BUCKETS, FlakyBackend())))
    scorer.set_routing(table)
    assert scorer.routing is table


@pytest.mark.parametrize("pipelined", [True, False], ids=["pipelined", "serial"])
def test_abortable_error_while_producing_rewinds_the_batch_and_loses_nothing(pipelined):
    # the transaction fails at the first produce: the batch's records must be read again (its offsets are
    # tracked before anything can fail), else the next batch would commit offsets past them
    faults = {"produce": [kafka_error(KafkaError._STATE, txn_requires_abort=True)]}
    summary, visible, consumer, producers, _s, spec = run_fake([req(i) for i in range(30)], faults=faults,
                                                                max_batch=10, pipelined=pipelined)
    ids = [orjson.loads(v)["id"] for _t, v, _k, _h in by_topic(visible, spec.topics.results)]
    assert sorted(ids) == sorted(f"r{i}" for i in range(30))  # none missing, none twice
    assert summary.aborts == 1 and consumer.committed_offsets[(spec.topics.requests, 0)] == 30


def test_pipelined_commit_takes_the_group_metadata_on_the_loop_thread():
    """The consumer is not thread-safe: only the loop's thread may touch it, even for the metadata that the
    committer thread's send_offsets_to_transaction carries."""
    loop_thread = threading.current_thread()
    threads: list[threading.Thread] = []

    class WatchedConsumer(FakeConsumer):
        def consumer_group_metadata(self):
            threads.append(threading.current_thread())
            return super().consumer_group_metadata()

    summary, *_rest = run_fake([req(i) for i in range(50)], max_batch=10, consumer_class=WatchedConsumer)
    assert summary.results == 50 and summary.batches == 5
    assert len(threads) == 5 and all(t is loop_thread for t in threads)


def test_request_latency_ends_at_the_commit_not_when_a_pipelined_commit_is_settled():
    """Pipelined, ``committed`` runs when the commit is settled (after the next batch was prepared): the
    per-request latency must end at the commit's own stamp, not at the time the hook runs."""
    from types import SimpleNamespace

    from sie.streams.eos import BatchTimes

    spec = echo_spec()
    at_s, committed_s, settled_s = 1000.0, 1000.004, 1000.500  # prepared, commit returned, hook runs
    config = ScorerConfig(settings=Settings(), spec=spec, instance="test-0")
    scorer = Scorer(config, RoutingTable.single(spec.version, FlakyBackend()), clients=fake_clients().clients,
                    wall_clock=lambda: settled_s)
    scorer._loop = SimpleNamespace(eos=SimpleNamespace(last_commit_s=0.002,
                                                       last_times=BatchTimes(committed=committed_s)))
    stats = {"ok": 1, "expired": 0, "dead": {}, "oldest_ms": 10.0, "queued": {spec.version: [10.0]},
             "at_ms": at_s * 1000.0}
    scorer.committed(stats, 1)
    unified = {"model_id": spec.name, "service_type": "scoring", "priority_level": "P1", "version": spec.version}
    assert scorer.metrics.value("sie_request_latency_seconds_count", unified) == 1
    assert scorer.metrics.value("sie_request_latency_seconds_sum", unified) == pytest.approx(0.014)
