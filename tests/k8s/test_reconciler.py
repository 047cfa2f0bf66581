"""The operator's reconcile decision (k8s/operator.py), with a fake control plane: what it sends, when."""

from __future__ import annotations

import copy
from typing import Any

import yaml

from sie.k8s.operator import ControlRefused, ControlUnavailable, Reconciler, cr_document, same_status
from sie.schemas.spec import load
from tests.k8s.kube_env import REPO

ARTICLE = yaml.safe_load((REPO / "examples" / "article" / "qwen2-7b-scoring.yaml").read_text())


class FakeControl:
    def __init__(self) -> None:
        self.applied: dict[str, Any] = {}
        self.posts: list[dict[str, Any]] = []
        self.down = False
        self.refuse: ControlRefused | None = None
        self.rollouts: dict[str, dict[str, Any]] = {}
        self.view: dict[str, Any] = {"phase": "Ready", "ready_replicas": 2, "desired_replicas": 2,
                                     "events": [{"kind": "placed", "replica_id": "m-0", "detail": "on gpu-01"}]}

    def model(self, name: str) -> dict[str, Any] | None:
        if self.down:
            raise ControlUnavailable("control plane http://x: GET /v1/models/m: ConnectError")
        spec = self.applied.get(name)
        if spec is None:
            return None
        return {**self.view, "name": name, "version": spec.version,
                "spec": {"version": spec.version, "digest": spec.digest(), "owner": spec.owner}}

    def rollout(self, name: str) -> dict[str, Any] | None:
        return self.rollouts.get(name)

    def apply(self, document: dict[str, Any], adopt: bool = False) -> dict[str, Any]:
        from sie.control.api.routers.models import ownership_problem

        if self.refuse is not None:
            raise self.refuse
        spec = load(document)
        problem = ownership_problem(self.applied.get(spec.name), spec.owner, adopt)  # the API's own check
        if problem:
            raise ControlRefused(409, problem, [])
        self.posts.append(document)
        self.adopted = adopt
        self.applied[spec.name] = spec
        return {"name": spec.name, "version": spec.version}


def _cr(generation: int = 1, **spec_changes: Any) -> dict[str, Any]:
    cr = copy.deepcopy(ARTICLE)
    cr["metadata"].update(generation=generation, uid="u-1", resourceVersion="7")
    cr["spec"].update(spec_changes)
    return cr


def _conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_first_pass_sends_the_spec_then_a_restart_sends_nothing():
    control = FakeControl()
    r = Reconciler(control, "sie")
    out = r.reconcile(_cr(), None)
    assert len(control.posts) == 1 and control.posts[0] == cr_document(_cr())
    assert ("Normal", "Applied", "version 1.2.0 sent to the control plane (specs topic)") in out.events
    assert out.status["ready"] == "2/2" and out.status["phase"] == "Ready"
    assert _conditions(out.status)["Ready"]["status"] == "True"
    assert _conditions(out.status)["Warnings"]["status"] == "True"  # image, tolerations, probes ...
    assert "spec.model.image" in _conditions(out.status)["Warnings"]["message"]
    # a second operator (or a restart) with the status written: nothing sent, no Event, the same status
    cr = {**_cr(), "status": out.status}
    again = Reconciler(control, "sie").reconcile(cr, None)
    assert len(control.posts) == 1 and again.events == []
    assert same_status(again.status, out.status)


def test_an_invalid_spec_is_refused_naming_the_field_and_nothing_is_sent():
    control = FakeControl()
    out = Reconciler(control, "sie").reconcile(_cr(maxConcurrentRequests=0), None)
    assert control.posts == []
    accepted = _conditions(out.status)["Accepted"]
    assert (accepted["status"], accepted["reason"]) == ("False", "InvalidSpec")
    assert accepted["message"].startswith("spec.maxConcurrentRequests: must be >= 1")
    assert out.events[0][:2] == ("Warning", "InvalidSpec") and "spec.maxConcurrentRequests" in out.events[0][2]
    assert out.status["phase"] == "Refused"
    # the same refusal again: the condition stays, no second Event
    again = Reconciler(control, "sie").reconcile({**_cr(maxConcurrentRequests=0), "status": out.status}, None)
    assert [e for e in again.events if e[1] == "InvalidSpec"] == []


def test_a_control_plane_refusal_becomes_a_condition_naming_its_field():
    control = FakeControl()
    control.refuse = ControlRefused(409, "schema_incompatible", [("inputs.text", "type changed string -> int")])
    out = Reconciler(control, "sie").reconcile(_cr(), None)
    accepted = _conditions(out.status)["Accepted"]
    assert (accepted["status"], accepted["reason"], accepted["message"]) == \
        ("False", "Conflict", "inputs.text: type changed string -> int")


def test_an_unreachable_control_plane_keeps_the_last_status_and_asks_for_a_retry():
    control = FakeControl()
    first = Reconciler(control, "sie").reconcile(_cr(), None)
    control.down = True
    out = Reconciler(control, "sie").reconcile({**_cr(), "status": first.status}, None)
    assert out.retry is True
    assert out.status["ready"] == "2/2"  # what was last known, not wiped
    synced = _conditions(out.status)["Synced"]
    assert (synced["status"], synced["reason"]) == ("False", "ControlPlaneUnavailable")
    assert _conditions(out.status)["Accepted"]["status"] == "True"
    assert ("Warning", "ControlPlaneUnavailable", synced["message"]) in out.events


def test_no_resend_while_a_rollout_to_this_version_runs_or_after_it_rolled_back_for_this_generation():
    control = FakeControl()
    Reconciler(control, "sie").reconcile(_cr(), None)
    new = _cr(generation=2)
    new["spec"]["model"] = {**new["spec"]["model"], "version": "1.3.0"}
    control.rollouts["qwen2-7b-scoring"] = {"phase": "Canary", "canary_version": "1.3.0", "stable_version": "1.2.0",
                                            "step": 1, "weight_percent": 10.0}
    out = Reconciler(control, "sie").reconcile(new, None)
    assert len(control.posts) == 1  # the rollout is the control plane's job now
    assert out.status["rollout"] == {"phase": "Canary", "step": 1, "weightPercent": 10.0, "canaryVersion": "1.3.0",
                                     "stableVersion": "1.2.0"}
    control.rollouts["qwen2-7b-scoring"] = {"phase": "RolledBack", "canary_version": "1.3.0", "reason": "p99 gate"}
    out = Reconciler(control, "sie").reconcile({**new, "status": {**out.status, "observedGeneration": 2}}, None)
    assert len(control.posts) == 1 and "rollout to 1.3.0 RolledBack: p99 gate" in out.status["reason"]
    edited = {**new, "metadata": {**new["metadata"], "generation": 3}, "status": out.status}
    Reconciler(control, "sie").reconcile(edited, None)
    assert len(control.posts) == 2  # the user edited it: try again


def test_a_second_resource_with_the_same_model_name_is_a_conflict():
    control = FakeControl()
    out = Reconciler(control, "sie").reconcile(_cr(), owner_of_name="team-a/qwen2-7b-scoring")
    assert control.posts == []
    accepted = _conditions(out.status)["Accepted"]
    assert accepted["reason"] == "Conflict" and "team-a/qwen2-7b-scoring" in accepted["message"]
