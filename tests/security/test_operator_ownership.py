"""The operator owns only what it applied (issue 37, item 4): ownership was decided only among ModelService
resources, so a CR named like a model ``sie apply`` applied (or one owned from an unwatched namespace) became
its owner, even a CR SIE refused, and deleting that CR deleted the other model.  Now the operator's mark
(``ModelService <ns>/<name> <uid>``) is in SIE's spec record (``ModelService.owner``); the operator POSTs and
DELETEs only a model carrying its own mark, and the control API checks the mark again."""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any

import pytest

from sie.control.api.routers import models as routes
from sie.k8s.operator import FINALIZER, Operator, Reconciler, cr_document, owner_mark
from sie.schemas.spec import load
from tests.k8s.test_reconciler import ARTICLE, FakeControl


def _cr(namespace: str = "team-a", uid: str = "u-a") -> dict[str, Any]:
    cr = copy.deepcopy(ARTICLE)
    cr["metadata"].update(namespace=namespace, uid=uid, generation=1, resourceVersion="7")
    return cr


def _by_sie_apply() -> Any:
    doc = copy.deepcopy(ARTICLE)
    doc["metadata"].pop("namespace", None)
    return load(doc)  # no owner mark: what sie apply / the API publish


class DeletingControl(FakeControl):
    def __init__(self) -> None:
        super().__init__()
        self.deletes: list[tuple[str, str | None]] = []

    def delete(self, name: str, owner: str | None = None) -> bool:
        self.deletes.append((name, owner))
        self.applied.pop(name, None)
        return True


def _reconcile(control: FakeControl, cr: dict[str, Any]) -> dict[str, Any]:
    return Reconciler(control, "sie").reconcile(cr, None).status  # type: ignore[arg-type]


def test_a_cr_named_like_a_model_sie_apply_applied_is_refused_and_changes_nothing():
    control = FakeControl()
    control.applied["qwen2-7b-scoring"] = theirs = _by_sie_apply()
    status = _reconcile(control, _cr())
    assert status["phase"] == "Refused" and "sie apply" in status["reason"], status
    assert [c for c in status["conditions"] if c["type"] == "Accepted"][0]["reason"] == "NotOwner"
    assert control.posts == [] and control.applied["qwen2-7b-scoring"] is theirs


def test_a_model_owned_from_another_namespace_is_not_taken_over():
    control = FakeControl()
    owner_cr = _cr("team-b", "u-b")
    control.apply(cr_document(owner_cr))
    status = _reconcile(control, _cr("team-a", "u-a"))
    assert status["phase"] == "Refused" and owner_mark(owner_cr) in status["reason"]
    assert control.applied["qwen2-7b-scoring"].owner == owner_mark(owner_cr)


def test_the_owner_applies_and_its_mark_is_in_the_spec_record():
    control = FakeControl()
    cr = _cr()
    assert _reconcile(control, cr)["phase"] != "Refused"
    assert control.applied["qwen2-7b-scoring"].owner == owner_mark(cr)


def test_a_model_applied_before_marks_is_adopted_only_by_the_cr_whose_status_proves_it():
    control = FakeControl()
    control.applied["qwen2-7b-scoring"] = before = _by_sie_apply()
    cr = _cr()
    cr["status"] = {"specDigest": before.digest(), "conditions": [{"type": "Accepted", "status": "True",
                                                                   "reason": "Applied", "message": "",
                                                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    _reconcile(control, cr)
    assert control.applied["qwen2-7b-scoring"].owner == owner_mark(cr) and control.adopted
    stranger = _cr()
    stranger["status"] = {"specDigest": "0" * 64, "conditions": cr["status"]["conditions"]}
    control.applied["qwen2-7b-scoring"] = before
    assert _reconcile(control, stranger)["phase"] == "Refused"


class _Kube:
    def __init__(self) -> None:
        self.patched: list[Any] = []
        self.events: list[Any] = []

    def patch_namespaced_custom_object(self, *args: Any) -> None:
        self.patched.append(args)

    def create_namespaced_event(self, ns: str, event: Any) -> None:
        self.events.append(event.reason)


def _operator(control: FakeControl) -> tuple[Operator, _Kube]:
    op = Operator.__new__(Operator)
    kube = _Kube()
    op.reconciler, op.custom, op.core, op.identity = Reconciler(control, "sie"), kube, kube, "test"  # type: ignore[arg-type]
    return op, kube


def _deleting(cr: dict[str, Any]) -> dict[str, Any]:
    cr["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=[FINALIZER])
    return cr


def test_deleting_a_refused_cr_deletes_nothing_and_releases_the_cr():
    control = DeletingControl()
    control.applied["qwen2-7b-scoring"] = _by_sie_apply()
    op, kube = _operator(control)
    assert op._finalize(_deleting(_cr()), {})
    assert control.deletes == [] and "qwen2-7b-scoring" in control.applied
    assert kube.patched and kube.events == ["NotOwner"]  # the finalizer is dropped: the CR goes, the model stays


def test_deleting_the_owner_deletes_with_its_mark():
    control = DeletingControl()
    cr = _cr()
    control.apply(cr_document(cr))
    op, _ = _operator(control)
    assert op._finalize(_deleting(cr), {})
    assert control.deletes == [("qwen2-7b-scoring", owner_mark(cr))]


@pytest.mark.parametrize(("applied_owner", "asked", "refused"), [
    (None, "ModelService a/m u", True),            # sie apply's model: the operator may not delete it
    ("ModelService b/m u2", "ModelService a/m u", True),
    ("ModelService a/m u", "ModelService a/m u", False),
    ("ModelService a/m u", None, False),           # a person (sie delete model) may
])
def test_the_api_checks_the_mark_before_a_delete(monkeypatch: pytest.MonkeyPatch, applied_owner: str | None,
                                                 asked: str | None, refused: bool):
    spec = _by_sie_apply().model_copy(update={"owner": applied_owner})
    service = SimpleNamespace(state=SimpleNamespace(snapshot=lambda: SimpleNamespace(specs={spec.name: spec})),
                              settings=None, spec_writer=None)
    deleted: list[str] = []
    monkeypatch.setattr("sie.schemas.spec_store.delete_spec", lambda settings, s, **_: deleted.append(s.name))
    if refused:
        with pytest.raises(routes.ApiError) as exc:
            routes._delete_model(service, spec.name, asked)
        assert exc.value.status == 409 and deleted == []
    else:
        routes._delete_model(service, spec.name, asked)
        assert deleted == [spec.name]


def test_a_marked_apply_over_another_owner_is_refused_by_the_api_an_unmarked_one_is_not():
    theirs = _by_sie_apply()
    assert routes.ownership_problem(theirs, "ModelService a/m u") is not None
    assert routes.ownership_problem(theirs, "ModelService a/m u", adopt=True) is None
    assert routes.ownership_problem(theirs.model_copy(update={"owner": "ModelService b/m u"}), "ModelService a/m u",
                                     adopt=True) is not None
    assert routes.ownership_problem(theirs.model_copy(update={"owner": "ModelService a/m u"}), None) is None
