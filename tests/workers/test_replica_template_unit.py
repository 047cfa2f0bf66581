"""The replica template (issue 39): an Assignment carries the spec without counts and rollout block, plus its hash;
the agent runs it as carried, a scale change leaves a replica's target alone, a version or resource change does
not; and a record of the release before (Assignment v2: the whole spec, no hash) reads as the same target."""

from __future__ import annotations

import copy
import io
import json

from fastavro import parse_schema, schemaless_writer

from sie.control.reconcile.config import ControlConfig
from sie.control.reconcile.controller import Controller
from sie.control.reconcile.ports import StaticLeadership
from sie.control.reconcile.records import ClusterState, assignment_from_record
from sie.schemas import avro_codec
from sie.schemas.avro_codec import HISTORY_DIR, MAGIC, Codec
from sie.schemas.replica_template import read_replica, template_from_json, template_of
from sie.schemas.spec import ModelService
from sie.workers.agent.messages import desired_from_assignment
from tests.control.reconcile.test_control_unit import (
    TIMEOUT,
    FakeClock,
    FakePublisher,
    gpu,
    heartbeat,
    register,
    spec_record,
)

ROLLOUT = {"steps": [10, 50, 100], "intervalSeconds": 4}


def doc(replicas: int = 1, top: int = 1, gpu_mb: int = 1024, version: str = "1.0.0", **extra) -> dict:
    record = spec_record("m", gpu_mb, replicas=replicas, sla={"min_replicas": replicas, "max_replicas": top},
                         model={"name": "m", "version": version}, **extra)
    return json.loads(record["spec_json"])


def canonical(d: dict) -> str:
    return json.dumps(d, sort_keys=True, separators=(",", ":"))


def test_the_template_is_the_spec_without_counts_and_rollout_block():
    full = doc(2, 5, rollout=ROLLOUT)
    assert full["sla"]["min_replicas"] == 2 and full["rollout"]
    template = json.loads(template_of(full).json)
    assert "rollout" not in template and not {"min_replicas", "max_replicas"} & set(template["sla"])
    rest = {k: v for k, v in full.items() if k != "rollout"}
    rest["sla"] = {k: v for k, v in full["sla"].items() if k not in ("min_replicas", "max_replicas")}
    assert template == rest  # nothing else left out
    runs = ModelService.from_document(template)  # what a worker parses
    assert (runs.version, runs.resources.gpu_memory_mb, runs.backend.type) == ("1.0.0", 1024, "python")


def test_counts_and_rollout_policy_leave_the_target_alone_version_and_resources_do_not():
    base = template_of(doc(1, 1))
    assert template_of(doc(3, 8)) == base
    assert template_of(doc(0, 2, rollout=ROLLOUT)) == base
    assert template_of(doc(1, 1, version="1.1.0")).hash != base.hash
    assert template_of(doc(1, 1, gpu_mb=2048)).hash != base.hash


def test_a_document_without_control_keys_is_its_own_template():
    connector = canonical({"kind": "connector", "name": "orders", "field_types": {"amount": "int"}})
    assert template_from_json(connector).json == connector
    assert template_from_json("not json").json == "not json"  # the launch reports it as the replica's failure


def _controller_record(spec: dict) -> dict:
    """The Assignment record this release's controller publishes for ``spec`` (one replica on one node)."""
    clock, state, pub = FakeClock(), ClusterState(), FakePublisher()
    ctl = Controller(state, pub, StaticLeadership(True, 1), ControlConfig(node_timeout_s=TIMEOUT))
    register(state, "node-a", [gpu(0)])
    heartbeat(state, "node-a", clock(), [gpu(0)])
    state.apply_spec("m", {"name": "m", "version": spec["version"], "spec_json": json.dumps(spec), "applied_at_ms": 0})
    ctl.reconcile(clock())
    (record,) = [r.value for r in pub.all("assignments")]
    return record


def test_the_controller_publishes_the_template_and_its_hash_and_the_agent_runs_it_as_carried():
    spec = doc(1, 3, rollout=ROLLOUT)
    record = _controller_record(spec)
    (item,) = record["replicas"]
    assert (item["spec_json"], item["template_hash"]) == (template_of(spec).json, template_of(spec).hash)
    (desired,) = desired_from_assignment(record)
    assert desired.template_json is item["spec_json"] and desired.template_hash == item["template_hash"]


def _encode_with(schema: dict, record: dict) -> bytes:
    buf = io.BytesIO()
    buf.write(MAGIC + avro_codec.fingerprint(schema))
    schemaless_writer(buf, parse_schema(copy.deepcopy(schema)), record)
    return buf.getvalue()


def test_an_assignment_of_the_release_before_reads_as_the_same_target():
    """A v2 record (the whole spec in ``spec_json``, no ``template_hash``), written with the v2 writer schema
    and read by this release: the agent gets the template and target this release's controller would send,
    and the controller reads it as equal to what it would publish (no re-publish, no restart)."""
    spec = doc(1, 4, rollout=ROLLOUT)
    companion = doc(1, 4, version="1.1.0", rollout=ROLLOUT)
    new = _controller_record(spec)
    new["replicas"][0]["companions"] = [template_of(companion).json]  # as during a rollout to 1.1.0
    old_item = {k: v for k, v in new["replicas"][0].items() if k != "template_hash"}
    old_item.update(spec_json=canonical(spec), companions=[canonical(companion)])
    v2 = json.loads((HISTORY_DIR / "Assignment.v2.avsc").read_text())
    old = Codec().decode(_encode_with(v2, {**new, "replicas": [old_item]}), expected="Assignment")
    assert old["replicas"][0]["template_hash"] == ""  # the default of a field the release before did not have

    (was,) = desired_from_assignment(old)
    (now,) = desired_from_assignment(new)
    assert (was.template_json, was.template_hash, was.target_hash) == \
        (now.template_json, now.template_hash, now.target_hash)
    assert was.companions == now.companions == (template_of(companion).json,)
    assert assignment_from_record(old).replicas == assignment_from_record(new).replicas
    assert read_replica(new["replicas"][0])[0] == template_of(spec)
