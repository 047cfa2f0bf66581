"""The CDC stage against a real broker: CDC events in, exactly the expected requests and dead letters out.

The expected requests are spelled out (keys, ops, typed values), not recomputed from the converter, and
every test reads with ``read_committed`` like a scorer would.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections import Counter
from pathlib import Path

import orjson
import pytest
import yaml
from confluent_kafka import Producer

from sie.connectors.cdc import parse_connector_spec
from sie.connectors.cdc_stage import CdcStage, CdcStageConfig
from tests.support.cdc_support import ORDER_FIELD_TYPES, ORDER_INPUT_SCHEMA, ORDER_MAPPING, malformed_cases, records
from tests.support.helpers import REPO_ROOT, consume_all, create_topic, wait_until
from tests.support.scorer_fixtures import CommittedReader

pytestmark = pytest.mark.kafka
REPO = REPO_ROOT


# --- helpers ---------------------------------------------------------------------------------------------
class Topics:
    def __init__(self, settings, source_partitions: int = 2) -> None:
        u = uuid.uuid4().hex[:10]
        self.name = f"cdc-test-{u}"
        self.source = create_topic(settings, f"test.cdc.src.{u}", source_partitions)
        self.requests = create_topic(settings, f"test.cdc.req.{u}", 3)
        self.dlq = create_topic(settings, f"test.cdc.dlq.{u}", 1)


def connector(topics: Topics, fmt: str, **overrides):
    doc = {"name": topics.name, "format": fmt, "source_topic": topics.source, "model": "orders-model",
           "tables": ["shop.orders"], "mapping": dict(ORDER_MAPPING), **overrides}
    return parse_connector_spec(doc)


class StageThread:
    """The stage library entry in a thread (same code as `sie cdc run`)."""

    def __init__(self, settings, spec, topics: Topics, **overrides) -> None:
        self.stop = threading.Event()
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.summary = None
        overrides = {"field_types": ORDER_FIELD_TYPES, **overrides}
        config = CdcStageConfig(settings=settings, connector=spec, instance="t0", request_topic=topics.requests,
                                dead_letter_topic=topics.dlq, max_wait_ms=10, session_timeout_ms=6000, **overrides)
        self.stage = CdcStage(config)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.summary = self.stage.run(self.stop, on_ready=self.ready.set)
        except BaseException as exc:  # surfaced by close()
            self.error = exc

    def records_done(self) -> int:
        return self.stage.summary().records

    def close(self):
        self.stop.set()
        self.thread.join(30)
        assert not self.thread.is_alive(), "stage did not stop within 30s"
        if self.error:
            raise self.error
        return self.summary


def produce(settings, topic: str, values: list[tuple[bytes | None, bytes | None]], partition: int = 0,
            headers: dict[int, list] | None = None) -> None:
    """Raw (key, value) records to one partition, in order (like canal's per-pk partitioning)."""
    producer = Producer(settings.kafka_client_config(**{"acks": "all", "enable.idempotence": True}))
    for i, (key, value) in enumerate(values):
        producer.produce(topic, value, key, partition, headers=(headers or {}).get(i))
    assert producer.flush(30) == 0


def malformed(name: str) -> tuple[bytes | None, bytes | None]:
    (case,) = [c for c in malformed_cases() if c["name"] == name]
    return case["key_bytes"], case["value_bytes"]


def canal_row_event(kind: str, rows: list[dict], pk_names: list[str] | None = ["id"]) -> bytes:  # noqa: B006
    mysql = {"id": "bigint(20)", "customer_id": "int(11)", "amount": "decimal(10,2)", "currency": "char(3)",
             "is_first_order": "tinyint(1)", "created_at": "datetime"}
    return json.dumps({"data": rows, "database": "shop", "table": "orders", "es": 1610676800000, "ts": 1,
                       "id": 9, "isDdl": False, "mysqlType": {k: v for k, v in mysql.items() if k in rows[0]},
                       "sqlType": None, "old": None, "pkNames": pk_names, "sql": "", "type": kind}).encode()


def requests_by_key(settings, topic: str, expected: int, stage: StageThread,
                    sources: int) -> tuple[list, dict[bytes, list[dict]]]:
    """The requests, read once the stage has committed all ``sources`` source records (its counters move
    only after a commit): the end of ``topic`` is then final, so a request written twice comes back too."""
    wait_until(lambda: stage.records_done() >= sources, 30,
               message=lambda: f"the stage to commit {sources} source records (has {stage.records_done()})")
    recs = consume_all(settings, topic, expected=expected, timeout=30)
    by_key: dict[bytes, list[dict]] = {}
    for r in recs:  # sorted by (partition, offset): per key that is production order
        by_key.setdefault(r.key, []).append(orjson.loads(r.value))
    return recs, by_key


# --- canal ----------------------------------------------------------------------------------------------
def test_canal_events_become_exactly_the_expected_requests_and_poison_is_dead_lettered(kafka_settings):
    topics = Topics(kafka_settings)
    no_currency = canal_row_event("INSERT", [{"id": "8", "customer_id": "1", "amount": "1.00",
                                              "is_first_order": "0", "created_at": "2021-01-15 02:12:04"}])
    stream = [
        records("canal_insert.json")[0],            # 0 10001 insert
        malformed("not_json"),                     # 1 invalid_json
        records("canal_update_mapped.json")[0],    # 2 10001 update: amount 12.50 -> 15.00
        records("canal_update_unmapped.json")[0],  # 3 only `note` changed -> unchanged_update
        records("canal_multi_insert.json")[0],     # 4 10002, 10003 (NULL amount), 10004 (negative decimal)
        malformed("canal_bad_decimal"),            # 5 cast_error
        records("canal_update_multi.json")[0],     # 6 10002 status only (skipped), 10004 amount changed
        records("canal_delete.json")[0],           # 7 delete, deletes not selected
        records("canal_ddl_alter.json")[0],        # 8 DDL
        malformed("json_array"),                   # 9 malformed_event
        malformed("canal_old_misaligned"),         # 10 malformed_event
        (None, no_currency),                       # 11 schema_mismatch (mapped column absent)
    ]
    produce(kafka_settings, topics.source, stream, headers={1: [("trace", b"abc"), ("sie.reason", b"stale")]})
    stage = StageThread(kafka_settings, connector(topics, "canal-json"), topics)
    try:
        recs, by_key = requests_by_key(kafka_settings, topics.requests, 6, stage, len(stream))
        dead = consume_all(kafka_settings, topics.dlq, expected=5, timeout=30)
    finally:
        summary = stage.close()

    assert len(recs) == 6 and len(dead) == 5
    assert {k: [(d["metadata"]["cdc"]["op"], d["inputs"]["amount"]) for d in v] for k, v in by_key.items()} == {
        b"shop.orders:10001": [("insert", 12.5), ("update", 15.0)],  # per-key order kept
        b"shop.orders:10002": [("insert", 0.99)],
        b"shop.orders:10003": [("insert", None)],  # SQL NULL stays null (the scorer's schema decides)
        b"shop.orders:10004": [("insert", -1234.56), ("update", -1234.56)],
    }
    first = by_key[b"shop.orders:10001"][0]
    assert first["id"].startswith("shop.orders:10001:1610676724000.") and first["id"].endswith(":insert")
    assert first["inputs"] == {"amount": 12.5, "customer_id": 501, "currency": "EUR", "is_first_order": True,
                               "created_at_ms": first["inputs"]["created_at_ms"]}
    assert isinstance(first["inputs"]["created_at_ms"], int)  # datetime string -> epoch ms for an int field
    assert first["metadata"]["cdc"] == {**first["metadata"]["cdc"], "format": "canal-json", "db": "shop",
                                        "table": "orders", "pk": {"id": 10001}}
    for key in by_key:  # one key -> one partition
        assert len({r.partition for r in recs if r.key == key}) == 1

    reasons = {int(d.headers["sie.source.offset"]): d.headers["sie.reason"].decode() for d in dead}
    assert reasons == {1: "invalid_json", 5: "cast_error", 9: "malformed_event", 10: "malformed_event",
                       11: "schema_mismatch"}
    for d in dead:
        offset = int(d.headers["sie.source.offset"])
        assert (d.key, d.value) == stream[offset]  # original bytes unchanged
        assert d.headers["sie.source.topic"] == topics.source.encode()
        assert d.headers["sie.source.partition"] == b"0"
        assert d.headers["sie.connector"] == topics.name.encode()
        assert d.headers["sie.detail"]
    by_offset = {int(d.headers["sie.source.offset"]): d for d in dead}
    assert by_offset[1].headers["trace"] == b"abc"  # the record's own headers kept, stale sie.* replaced
    assert by_offset[1].headers["sie.reason"] == b"invalid_json"
    assert b"amount" in by_offset[5].headers["sie.detail"]
    assert b"currency" in by_offset[11].headers["sie.detail"]

    assert summary.records == len(stream) and summary.requests == 6
    assert summary.skipped == {"unchanged_update": 2, "operation_not_selected": 1, "ddl": 1}
    assert summary.dead_letters == {"invalid_json": 1, "cast_error": 1, "malformed_event": 2,
                                    "schema_mismatch": 1}
    m = stage.stage.metrics
    assert m.value("sie_cdc_requests_out_total") == 6
    assert m.value("sie_cdc_skipped_total", reason="ddl") == 1
    assert m.value("sie_cdc_dead_letters_total", reason="malformed_event") == 2


def test_canal_deletes_are_scored_with_the_before_image_when_enabled(kafka_settings):
    topics = Topics(kafka_settings, source_partitions=1)
    stream = [records("canal_insert.json")[0], records("canal_delete.json")[0], records("canal_ddl_alter.json")[0]]
    produce(kafka_settings, topics.source, stream)
    stage = StageThread(kafka_settings, connector(topics, "canal-json", operations=["insert", "update", "delete"]),
                        topics)
    try:
        _recs, by_key = requests_by_key(kafka_settings, topics.requests, 2, stage, len(stream))
    finally:
        summary = stage.close()
    docs = by_key[b"shop.orders:10001"]
    assert [d["metadata"]["cdc"]["op"] for d in docs] == ["insert", "delete"]
    assert docs[1]["inputs"]["amount"] == 12.5 and docs[1]["id"].endswith(":delete")
    assert summary.skipped == {"ddl": 1}


def test_canal_event_without_primary_key_is_dead_lettered_as_missing_primary_key(kafka_settings):
    topics = Topics(kafka_settings, source_partitions=1)
    row = {"id": "7", "customer_id": "1", "amount": "1.00", "currency": "EUR", "is_first_order": "0",
           "created_at": "2021-01-15 02:12:04"}
    produce(kafka_settings, topics.source, [(None, canal_row_event("INSERT", [row], None))])  # MINIMAL image
    stage = StageThread(kafka_settings, connector(topics, "canal-json"), topics)
    try:
        dead = consume_all(kafka_settings, topics.dlq, expected=1, timeout=30)
    finally:
        stage.close()
    assert [d.headers["sie.reason"] for d in dead] == [b"missing_primary_key"]


# --- poison that used to crash the stage, and NULL into the model's required inputs --------------------------
def _order_row(pk: int, **overrides) -> dict:
    return {"id": str(pk), "customer_id": "1", "amount": "1.25", "currency": "EUR", "is_first_order": "0",
            "created_at": "2021-01-15 02:12:04", **overrides}


def _canal_with(row: dict, **doc_overrides) -> bytes:
    doc = json.loads(canal_row_event("INSERT", [row]))
    for key, value in doc_overrides.items():
        if key == "mysql":
            doc["mysqlType"].update(value)
        else:
            doc[key] = value
    return json.dumps(doc).encode()


def test_poison_that_crashed_the_stage_and_null_into_required_inputs_become_one_dead_letter_each(kafka_settings):
    """Nesting 1,000 levels deep (RecursionError when formatted), a 400-digit BIGINT into a float input
    (OverflowError), '1e999' (inf, written as null) and SQL NULL into a required, non-nullable input
    among valid rows: every valid row is one request, every bad one one dead letter with its reason and
    the stage never stops."""
    topics = Topics(kafka_settings, source_partitions=1)
    nested = "[" * 1000 + "]" * 1000
    stream = [
        (None, _canal_with(_order_row(1))),                                               # 0 request
        (None, _canal_with(_order_row(2)).replace(b'"1.25"', nested.encode())),  # 1 malformed_event (a column)
        (None, _canal_with(_order_row(3)).replace(b'"database": "shop"', b'"database": ' + nested.encode())),  # 2 (ditto)
        (None, _canal_with(_order_row(4, amount="9" * 400), mysql={"amount": "bigint(20)"})),  # 3 cast_error
        (None, _canal_with(_order_row(5))),                                               # 4 request
        (None, _canal_with(_order_row(6, customer_id=None))),                             # 5 null_in_required_field
        (None, _canal_with(_order_row(7, amount=None, is_first_order=None))),             # 6 request: null, omitted
        (None, _canal_with(_order_row(8, amount="1e999"))),                               # 7 cast_error
        (None, _canal_with(_order_row(9))),                                               # 8 request
    ]
    produce(kafka_settings, topics.source, stream)
    stage = StageThread(kafka_settings, connector(topics, "canal-json"), topics, field_types=None,
                        input_schema=ORDER_INPUT_SCHEMA)
    try:
        _recs, by_key = requests_by_key(kafka_settings, topics.requests, 4, stage, len(stream))
        dead = consume_all(kafka_settings, topics.dlq, expected=5, timeout=30)
        assert stage.thread.is_alive() and stage.error is None  # still running after every poison record
    finally:
        summary = stage.close()

    assert sorted(by_key) == [b"shop.orders:1", b"shop.orders:5", b"shop.orders:7", b"shop.orders:9"]
    assert all(len(docs) == 1 for docs in by_key.values())
    assert by_key[b"shop.orders:7"][0]["inputs"] == {"amount": None, "customer_id": 1, "currency": "EUR",
                                                    "created_at_ms": 1610676724000}  # nullable: null; optional: left out
    reasons = {int(d.headers["sie.source.offset"]): d.headers["sie.reason"].decode() for d in dead}
    assert reasons == {1: "malformed_event", 2: "malformed_event", 3: "cast_error", 5: "null_in_required_field",
                       7: "cast_error"}
    by_offset = {int(d.headers["sie.source.offset"]): d for d in dead}
    for offset, d in by_offset.items():
        assert (d.key, d.value) == stream[offset]  # the source bytes, unchanged
    assert b"nested" in by_offset[1].headers["sie.detail"] and b"nested" in by_offset[2].headers["sie.detail"]
    assert b"amount" in by_offset[3].headers["sie.detail"] and b"amount" in by_offset[7].headers["sie.detail"]
    null = by_offset[5].headers
    assert b"customer_id" in null["sie.detail"]
    assert (null["sie.cdc.db"], null["sie.cdc.table"], null["sie.cdc.pk"], null["sie.cdc.op"]) == (
        b"shop", b"orders", b"6", b"insert")
    assert null["sie.cdc.position"] == b"batch=9,es=1610676800000"
    assert summary.records == len(stream) and summary.requests == 4
    assert summary.dead_letters == {"malformed_event": 2, "cast_error": 2, "null_in_required_field": 1}


def test_an_unforeseen_failure_converting_one_record_is_a_conversion_error_dead_letter(kafka_settings, monkeypatch):
    """The last line of defence: whatever a record makes the conversion raise, it is dead-lettered and the
    partition moves on (raising would crash the stage, and a restart would read the same record again)."""
    from sie.connectors.cdc import to_requests

    real = to_requests.DECODERS["canal-json"]

    def flaky_decoder(key, value, options):
        if b"boom" in value:
            raise RuntimeError("boom: a bug, not a bad record")
        return real(key, value, options)

    monkeypatch.setitem(to_requests.DECODERS, "canal-json", flaky_decoder)
    topics = Topics(kafka_settings, source_partitions=1)
    stream = [(None, _canal_with(_order_row(1))), (None, _canal_with(_order_row(2), sql="boom")),
              (None, _canal_with(_order_row(3)))]
    produce(kafka_settings, topics.source, stream)
    stage = StageThread(kafka_settings, connector(topics, "canal-json"), topics)
    try:
        _recs, by_key = requests_by_key(kafka_settings, topics.requests, 2, stage, len(stream))
        dead = consume_all(kafka_settings, topics.dlq, expected=1, timeout=30)
        assert stage.thread.is_alive() and stage.error is None
    finally:
        summary = stage.close()
    assert sorted(by_key) == [b"shop.orders:1", b"shop.orders:3"]
    (d,) = dead
    assert d.headers["sie.reason"] == b"conversion_error" and d.headers["sie.source.offset"] == b"1"
    assert d.headers["sie.detail"].startswith(b"unexpected RuntimeError: boom")
    assert summary.dead_letters == {"conversion_error": 1}


# --- Debezium and Maxwell -------------------------------------------------------------------------------
def test_debezium_envelopes_tombstones_and_pk_change_through_the_stage(kafka_settings):
    topics = Topics(kafka_settings, source_partitions=1)
    stream = (records("debezium_schema_create.json") + records("debezium_plain_update.json")
              + records("debezium_schema_delete.json") + records("debezium_pk_change.json")
              + records("debezium_schema_change.json") + [malformed("debezium_unknown_op")])
    produce(kafka_settings, topics.source, stream)
    spec = connector(topics, "debezium-json", operations=["insert", "update", "delete"],
                     decimal_scales={"shop.orders.amount": 2})
    stage = StageThread(kafka_settings, spec, topics)
    try:
        _recs, by_key = requests_by_key(kafka_settings, topics.requests, 5, stage, len(stream))
        dead = consume_all(kafka_settings, topics.dlq, expected=1, timeout=30)
    finally:
        summary = stage.close()
    assert {k: [(d["metadata"]["cdc"]["op"], d["inputs"]["amount"]) for d in v] for k, v in by_key.items()} == {
        # create (schema wrapper, base64 decimal with scale from the schema), update (no wrapper, scale from
        # decimal_scales), delete (before image), then the pk change: delete of the old key ...
        b"shop.orders:1004": [("insert", 12.5), ("update", 15.0), ("delete", 15.0), ("delete", 15.0)],
        b"shop.orders:2004": [("insert", 15.0)],  # ... and create of the new one
    }
    assert summary.skipped.get("tombstone") == 2 and summary.skipped.get("ddl") == 1
    assert [d.headers["sie.reason"] for d in dead] == [b"malformed_event"]


def test_maxwell_rows_through_the_stage(kafka_settings):
    topics = Topics(kafka_settings, source_partitions=1)
    stream = records("maxwell_insert.json") + records("maxwell_update.json") + records("maxwell_bootstrap.json")
    produce(kafka_settings, topics.source, stream)
    stage = StageThread(kafka_settings, connector(topics, "maxwell-json"), topics)
    try:
        expected = 2 + sum(1 for k, v in records("maxwell_bootstrap.json")
                           if v and orjson.loads(v).get("type") == "bootstrap-insert")
        _recs, by_key = requests_by_key(kafka_settings, topics.requests, expected, stage, len(stream))
    finally:
        summary = stage.close()
    ops = [d["metadata"]["cdc"]["op"] for d in by_key[b"shop.orders:10001"]]
    assert ops[:2] == ["insert", "update"]
    assert summary.skipped.get("unchanged_update") == 1
    assert summary.requests == expected and summary.dead_letters == {}


# --- exactly once through the CLI, across SIGKILL -----------------------------------------------------
def _write_connector(tmp_path: Path, topics: Topics) -> Path:
    path = tmp_path / "connector.yaml"
    path.write_text(yaml.safe_dump({"kind": "CdcConnector", "metadata": {"name": topics.name},
                                    "spec": {"format": "canal-json", "sourceTopic": topics.source,
                                             "model": "orders-model", "tables": ["shop.*"],
                                             "mapping": dict(ORDER_MAPPING), "requestTopic": topics.requests}}))
    return path


def _cli_stage(path: Path, bootstrap: str, dlq: str, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "sie", "--bootstrap-servers", bootstrap, "cdc", "run", "-f", str(path),
         "--instance", "i0", "--max-batch", "200", "--dead-letter-topic", dlq, "--partitions", "3",
         "--session-timeout-ms", "6000", "--log-level", "warning"],
        cwd=REPO, stdout=open(log, "ab"), stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def test_sigkill_mid_stream_then_restart_gives_every_request_exactly_once(kafka_settings, bootstrap_servers,
                                                                          tmp_path):
    topics = Topics(kafka_settings)
    n = 4000
    values = []
    for i in range(n):
        row = {"id": str(i), "customer_id": str(i % 50), "amount": f"{i}.25", "currency": "EUR",
               "is_first_order": "1", "created_at": "2021-01-15 02:12:04"}
        values.append((None, canal_row_event("INSERT", [row])))
    produce(kafka_settings, topics.source, values[: n // 2], partition=0)
    produce(kafka_settings, topics.source, values[n // 2:], partition=1)
    path = _write_connector(tmp_path, topics)
    log = tmp_path / "stage.log"
    reader = CommittedReader(kafka_settings, topics.requests)
    try:
        proc = _cli_stage(path, bootstrap_servers, topics.dlq, log)
        try:
            wait_until(lambda: reader.count() >= 300 or proc.poll() is not None, 60,
                       message="the first committed requests")
            assert proc.poll() is None, log.read_text()
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        assert reader.count() < n, "killed too late to prove anything; raise n"
        proc = _cli_stage(path, bootstrap_servers, topics.dlq, log)
        try:
            wait_until(lambda: reader.count() >= n, 60, message=lambda: f"{n} requests (have {len(reader.records)})")
            reader.read_to_end()  # on to the end: a duplicate past the n-th is counted too
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0, log.read_text()
    finally:
        reader.close()
    ids = Counter(orjson.loads(m.value())["id"] for m in reader.records)
    assert len(ids) == n and max(ids.values()) == 1  # zero missing, zero duplicated
    assert "stopped after" in log.read_text()


# --- end to end: canal -> stage -> scorer -> results -------------------------------------------------------
def _fraud_spec_for_test(name: str):
    from sie.schemas.spec import load

    doc = yaml.safe_load((REPO / "examples" / "fraud-scorer.yaml").read_text())
    doc["metadata"]["name"] = name
    doc["spec"]["model"]["name"] = name
    return load(doc, origin=str(REPO / "examples" / "fraud-scorer.yaml"), base_dir=REPO / "examples")


def test_end_to_end_canal_to_stage_to_scorer_gives_one_result_per_converted_row(kafka_settings):
    from sie.connectors.cdc import load_connector_spec
    from sie.connectors.cdc_stage import field_types_of
    from sie.kernel.admin import ensure_model_topics
    from sie.workers.backends import backend_config_from_spec, create_backend
    from tests.support.scorer_fixtures import ScorerThread

    model = _fraud_spec_for_test(f"fraud-e2e-{uuid.uuid4().hex[:8]}")
    t = model.topics
    ensure_model_topics(kafka_settings, [t.requests, t.results, t.dead_letters], 2)
    example = load_connector_spec(REPO / "examples" / "cdc" / "orders-to-fraud.yaml")
    topics = Topics(kafka_settings, source_partitions=1)
    spec = example.model_copy(update={"name": topics.name, "source_topic": topics.source, "model": model.name})
    events = [line.strip() for line in (REPO / "examples" / "cdc" / "canal-orders.jsonl").read_bytes().splitlines()
              if line.strip()]
    produce(kafka_settings, topics.source, [(None, e) for e in events])

    def load(spec_):
        backend = create_backend(backend_config_from_spec(spec_))
        backend.load()
        return backend

    scorer = ScorerThread(kafka_settings, model, instance="e2e", backend_factory=load)
    config = CdcStageConfig(settings=kafka_settings, connector=spec, instance="e2e", field_types=field_types_of(model),
                            request_topic=t.requests, dead_letter_topic=topics.dlq, max_wait_ms=10,
                            session_timeout_ms=6000)
    stage_obj = CdcStage(config)
    stage_stop = threading.Event()
    stage_thread = threading.Thread(target=stage_obj.run, args=(stage_stop,), daemon=True)
    stage_thread.start()
    try:
        requests = consume_all(kafka_settings, t.requests, expected=5, timeout=45)
        results = consume_all(kafka_settings, t.results, expected=5, timeout=60)
        dead = consume_all(kafka_settings, topics.dlq, expected=1, timeout=20)
    finally:
        stage_stop.set()
        stage_thread.join(30)
        scorer.close()
    request_ids = {orjson.loads(r.value)["id"] for r in requests}
    result_docs = [orjson.loads(r.value) for r in results]
    assert len(requests) == len(request_ids) == 5 and sorted(d["id"] for d in result_docs) == sorted(request_ids)
    for doc, rec in zip(result_docs, results):
        assert doc["status"] == "ok" and 0.0 <= doc["outputs"]["fraud_probability"] <= 1.0
        assert doc["metadata"]["cdc"]["table"] == "orders"  # the CDC provenance travels to the result
        assert rec.key.startswith(b"shop.orders:")  # results keyed by row: an upserting sink keeps the latest
    assert [d.headers["sie.reason"] for d in dead] == [b"cast_error"]
    assert consume_all(kafka_settings, t.dead_letters) == []  # the scorer (stopped) dead-lettered nothing
