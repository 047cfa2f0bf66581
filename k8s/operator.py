"""The SIE operator: ``ModelService`` custom resources in, specs on SIE's control plane out, status back.

    while running:
        lease.step()                                  # one replica acts (k8s/lease.py)
        keys <- changed CRs (watch) | every CR (each resync_s) | CRs whose last pass failed (backoff)
        if leading: for each key: reconcile(CR)

    reconcile(CR):                                    # level-triggered: it compares, it never remembers
        deleted (deletionTimestamp)? -> DELETE the model from SIE only if it carries our mark (404 = gone), drop
                                        our finalizer, done
        no finalizer yet?            -> add it (so a delete waits for the model to leave SIE)
        another CR has the name?     -> Conflict (the older one owns the model; names are cluster-wide in SIE)
        the applied model carries another owner mark (or none: sie apply)? -> Refused NotOwner; never POSTed,
                                        never deleted (the mark is ModelService.owner in SIE's spec record)
        parse the CR as a document with THE reader (sie.schemas.spec.load, what sie validate/apply run)
            refused -> phase Refused, condition Accepted=False + an Event naming the field; done
        ask the control plane: GET /v1/models/{name} -> the applied spec's digest, phase, ready/desired
        applied digest != ours (and no rollout to our version is running or has just failed)?
            POST /v1/models (the control plane runs the spec policy, the artifact, tier and schema
            compatibility checks and starts a rollout if the spec asks for one, then publishes it on the
            specs topic; its refusals name the field: condition + Event)
        status <- phase, ready "2/2", version, reason, rollout step, last event, conditions; patch it if it
                  changed (never a write per pass)

WHY through the control plane's HTTP API and not straight onto the specs topic: it is the one write path
that already has every check (spec policy, artifacts on the cluster, tier-0, schema compatibility, rollouts,
audit events with the caller); the operator needs no Kafka credentials at all, only an operator token.

WHY the official ``kubernetes`` client and not kopf: this reconcile is one level-triggered function of
(CR, cluster), elected through a coordination Lease, with no bookkeeping annotations on the objects; kopf's
defaults fight each of those (docs/kubernetes.md, "The operator").  The RBAC is exactly: its CRD (+ status,
+ finalizers), Events (create, patch) and Leases.

Idempotence: a pass that finds the applied digest equal publishes nothing, so a restarted (or a second,
briefly overlapping) operator changes nothing; Events are written when a condition changes, not per pass.

Failures:
| what | effect |
|---|---|
| control plane unreachable | condition Synced=False (reason ControlPlaneUnavailable), retried with backoff; no delete is lost (the finalizer holds the CR) |
| spec refused (parser, policy, 409/422) | phase Refused, Accepted=False naming the field, one Event per change; not retried until the CR changes |
| API server unreachable / watch broken | the watch restarts with backoff and relists; the resync lists every CR anyway |
| Lease lost | stops acting within renew_deadline_s (before another replica can take it) |
| two CRs, one model name (two namespaces) | the older owns it; the other is Refused with reason Conflict |
| a CR named like a model it did not apply (``sie apply``, a CR of an unwatched namespace or another release) | Refused with reason NotOwner; deleting the CR deletes nothing (the operator deletes only a model carrying its mark, and the API checks the mark again) |
| a model applied by this operator before ownership marks | adopted (marked) only by the CR whose status proves it applied that very spec (Accepted=True, the applied digest) |
"""

from __future__ import annotations

import datetime as dt
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import yaml

from sie.k8s.crd import API_VERSION, GROUP, KIND, PLURAL, VERSION
from sie.kernel.errors import SieError
from sie.kernel.settings import Settings
from sie.schemas.spec_document import OWNER_ANNOTATION

log = logging.getLogger("sie.k8s.operator")

FINALIZER = f"{GROUP}/operator"
TERMINAL_FAILED = frozenset({"RolledBack", "Failed"})
ACTIVE_ROLLOUT = frozenset({"Pending", "Surging", "Canary", "Promoting", "Draining", "Paused", "RollingBack"})


class ControlUnavailable(SieError):
    """The control plane did not answer (or answered 5xx): retry later, change nothing."""


class ControlRefused(SieError):
    """The control plane refused a spec (4xx): ``fields`` as ``[(field, reason)]``."""

    def __init__(self, status: int, error: str, fields: list[tuple[str, str]]) -> None:
        super().__init__(error)
        self.status, self.fields = status, fields


class ControlClient:
    """The four calls the operator makes to a control plane's HTTP API, with its operator token.

    The token goes where the CLI's would (``token_for_url``): to a loopback URL or over https (plain http to
    another host only with ``SIE_API_TOKEN_OVER_HTTP=true``); otherwise ``SieError`` before anything is sent.
    Redirects are never followed."""

    def __init__(self, settings: Settings, url: str, timeout: float = 15.0) -> None:
        from sie.control.api.auth import token_for_url

        self.url = url.rstrip("/")
        self._token = token_for_url(settings, self.url)
        self._verify: Any = str(settings.api_ca) if settings.api_ca else True
        self._timeout = timeout

    def _call(self, method: str, path: str, body: str | None = None) -> tuple[int, Any]:
        import httpx

        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        if body is not None:
            headers["Content-Type"] = "application/yaml"
        try:
            with httpx.Client(verify=self._verify, timeout=self._timeout, follow_redirects=False) as client:
                response = client.request(method, self.url + path, content=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ControlUnavailable(f"control plane {self.url}: {method} {path}: {type(exc).__name__}") from None
        try:
            payload = response.json()
        except ValueError:
            payload = {"error": response.text[:200]}
        if response.status_code >= 500 or response.status_code in (401, 403):
            # 401/403: our token is wrong; nothing the CR can fix, so it is "unavailable", not "refused"
            raise ControlUnavailable(f"control plane {self.url}: {method} {path}: {response.status_code} "
                                     f"{(payload or {}).get('error', '')}".rstrip())
        return response.status_code, payload

    def model(self, name: str) -> dict[str, Any] | None:
        status, body = self._call("GET", f"/v1/models/{name}")
        return None if status == 404 else body

    def rollout(self, name: str) -> dict[str, Any] | None:
        status, body = self._call("GET", f"/v1/rollouts/{name}")
        return body if status == 200 else None

    def apply(self, document: dict[str, Any], adopt: bool = False) -> dict[str, Any]:
        """POST the document; ``adopt``: mark an unmarked model (one this operator applied before marks)."""
        status, body = self._call("POST", "/v1/models" + ("?adopt=1" if adopt else ""),
                                  yaml.safe_dump(document, sort_keys=False))
        if status >= 400:
            errors = body.get("errors") or [] if isinstance(body, dict) else []
            fields = [(str(e.get("field")), str(e.get("reason"))) for e in errors if isinstance(e, dict)]
            raise ControlRefused(status, str(body.get("error") if isinstance(body, dict) else body), fields)
        return body

    def delete(self, name: str, owner: str | None = None) -> bool:
        """True when the model was deleted now, False when it was not applied (404); ``owner``: only if the
        applied spec carries this mark (409 otherwise: ``ControlRefused``)."""
        from urllib.parse import quote

        status, body = self._call("DELETE", f"/v1/models/{name}" + (f"?owner={quote(owner)}" if owner else ""))
        if status == 404:
            return False
        if status >= 400:
            raise ControlRefused(status, str(body.get("error") if isinstance(body, dict) else body), [])
        return True


# ------------------------------------------------------------------------------------------ reconcile


@dataclass
class Outcome:
    """What one pass decided for one CR: the status to write and the Events to emit."""

    status: dict[str, Any]
    events: list[tuple[str, str, str]] = field(default_factory=list)  # (type, reason, message)
    retry: bool = False


def _condition(kind: str, ok: bool | None, reason: str, message: str, generation: int) -> dict[str, Any]:
    return {"type": kind, "status": "Unknown" if ok is None else ("True" if ok else "False"), "reason": reason,
            "message": message[:32000], "observedGeneration": generation}


def _last_event(view: dict[str, Any]) -> str | None:
    rows = view.get("events") or []
    if not rows:
        return None
    row = rows[-1]
    where = row.get("replica_id") or row.get("node") or ""
    return f"{row.get('kind')}{' ' + where if where else ''}: {row.get('detail') or ''}".strip()[:1000]


def owner_mark(cr: dict[str, Any]) -> str:
    """The ownership mark this CR's model carries in SIE's spec record (``ModelService.owner``): namespace, name
    and uid, so a CR of the same name elsewhere, or re-created, is another owner."""
    meta = cr.get("metadata") or {}
    return f"ModelService {meta.get('namespace')}/{meta.get('name')} {meta.get('uid')}"


def cr_document(cr: dict[str, Any]) -> dict[str, Any]:
    """The ModelService document SIE parses: the CR's spec under its name and labels, and the operator's ownership
    mark as the only annotation (the CR's own annotations, namespace and uid are Kubernetes', not the model's: a
    CR cannot bring its own mark)."""
    meta = cr.get("metadata") or {}
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if "/" not in k}  # app.kubernetes.io/... stay out
    doc_meta: dict[str, Any] = {"name": meta.get("name"), "annotations": {OWNER_ANNOTATION: owner_mark(cr)}}
    if labels:
        doc_meta["labels"] = labels
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": doc_meta, "spec": cr.get("spec") or {}}


def applied_before_marks(status: dict[str, Any], applied: dict[str, Any]) -> bool:
    """Did this CR apply the (unmarked) model in ``applied`` before ownership marks existed?  Only the operator
    writes a CR's status (its RBAC: ``modelservices/status``), so ``Accepted=True/Applied`` with the applied
    spec's digest proves it; a new CR named like a model ``sie apply`` applied has no such status."""
    if applied.get("owner") is not None or not status.get("specDigest"):
        return False
    accepted = [c for c in status.get("conditions") or [] if c.get("type") == "Accepted"]
    return bool(accepted) and accepted[0].get("status") == "True" and accepted[0].get("reason") == "Applied" \
        and status.get("specDigest") == applied.get("digest")


class Reconciler:
    """One level-triggered pass for one CR; pure but for the control-plane client it is given."""

    def __init__(self, control: ControlClient, topic_prefix: str) -> None:
        self.control = control
        self.topic_prefix = topic_prefix

    def reconcile(self, cr: dict[str, Any], owner_of_name: str | None) -> Outcome:
        """``owner_of_name``: ``namespace/name`` of the CR that owns this model name (the oldest), None if this one."""
        from sie.schemas.spec import InvalidSpec, load

        meta = cr["metadata"]
        name, generation = meta["name"], int(meta.get("generation") or 0)
        old = cr.get("status") or {}
        if owner_of_name is not None:
            msg = f"model name {name!r} is already declared by ModelService {owner_of_name}; SIE model names are cluster-wide"
            return self._outcome(old, {"phase": "Refused", "reason": msg}, generation,
                                 accepted=(False, "Conflict", msg))
        try:
            spec = load(cr_document(cr), origin=f"ModelService {meta.get('namespace')}/{name}",
                        topic_prefix=self.topic_prefix)
        except InvalidSpec as exc:
            problems = list(exc.problems)
            return self._outcome(old, {"phase": "Refused", "reason": problems[0]}, generation,
                                 accepted=(False, "InvalidSpec", "; ".join(problems)))
        warnings = list(spec.warnings)
        digest = spec.digest()
        try:
            view = self.control.model(name)
            applied = (view or {}).get("spec") or {}
            adopt = bool(applied) and applied_before_marks(old, applied)
            if applied and applied.get("owner") != owner_mark(cr) and not adopt:
                msg = (f"model {name!r} is managed by {applied.get('owner') or 'sie apply or the API (no owner mark)'}, "
                       "not by this ModelService: the operator neither changes nor deletes it; delete it there "
                       f"first (sie delete model {name}) or give this ModelService another name")
                return self._outcome(old, {"phase": "Refused", "reason": msg}, generation,
                                     accepted=(False, "NotOwner", msg))
            rollout = None
            if view is not None and applied.get("version") != spec.version:
                rollout = self.control.rollout(name)
            published = None
            if applied.get("digest") != digest and not self._rollout_holds(rollout, spec.version, old, generation):
                try:
                    self.control.apply(cr_document(cr), adopt=adopt)
                except ControlRefused as exc:
                    detail = "; ".join(f"{f}: {r}" for f, r in exc.fields) or str(exc)
                    reason = {409: "Conflict", 422: "Refused"}.get(exc.status, "Refused")
                    return self._outcome(old, {"phase": "Refused", "reason": detail, "warnings": warnings}, generation,
                                         accepted=(False, reason, detail))
                published = f"version {spec.version} sent to the control plane (specs topic)"
                view = self.control.model(name) or view
                if view is not None and (view.get("spec") or {}).get("version") != spec.version:
                    rollout = self.control.rollout(name)
        except ControlUnavailable as exc:
            status = {**{k: v for k, v in old.items() if k != "conditions"}}
            out = self._outcome(old, status, generation, synced=(False, "ControlPlaneUnavailable", str(exc)),
                                keep_accepted=True)
            out.retry = True
            return out
        status = self._status_from(view, rollout, spec.version, warnings)
        status["specDigest"] = digest
        status["observedGeneration"] = generation
        out = self._outcome(old, status, generation, accepted=(True, "Applied", f"version {spec.version} accepted by SIE"),
                            warnings=warnings)
        if published:
            out.events.insert(0, ("Normal", "Applied", published))
        return out

    @staticmethod
    def _rollout_holds(rollout: dict[str, Any] | None, version: str, old: dict[str, Any], generation: int) -> bool:
        """Do not POST again while a rollout to this version runs, nor after it failed for this generation
        (a new generation, i.e. an edited CR, tries again)."""
        if not rollout or rollout.get("canary_version") != version:
            return False
        if rollout.get("phase") in ACTIVE_ROLLOUT:
            return True
        return rollout.get("phase") in TERMINAL_FAILED and old.get("observedGeneration") == generation

    @staticmethod
    def _status_from(view: dict[str, Any] | None, rollout: dict[str, Any] | None, version: str,
                     warnings: list[str]) -> dict[str, Any]:
        if view is None:
            return {"phase": "Pending", "reason": "accepted; the control plane has not reconciled it yet",
                    "warnings": warnings}
        ready, desired = int(view.get("ready_replicas") or 0), int(view.get("desired_replicas") or 0)
        status: dict[str, Any] = {
            "phase": view.get("phase") or "Pending", "ready": f"{ready}/{desired}", "readyReplicas": ready,
            "desiredReplicas": desired, "version": view.get("version") or (view.get("spec") or {}).get("version"),
            "reason": view.get("reason") or "", "warnings": warnings,
        }
        event = _last_event(view)
        if event:
            status["lastEvent"] = event
        if rollout:
            status["rollout"] = {k2: rollout[k1] for k1, k2 in (
                ("phase", "phase"), ("step", "step"), ("weight_percent", "weightPercent"),
                ("canary_version", "canaryVersion"), ("stable_version", "stableVersion"), ("reason", "reason"))
                if rollout.get(k1) is not None}
            if rollout.get("phase") in TERMINAL_FAILED and rollout.get("canary_version") == version:
                status["reason"] = (f"rollout to {version} {rollout['phase']}: {rollout.get('reason') or ''}; "
                                    "edit the ModelService to try again").strip()
        return status

    def _outcome(self, old: dict[str, Any], status: dict[str, Any], generation: int, *,
                 accepted: tuple[bool, str, str] | None = None, synced: tuple[bool, str, str] | None = None,
                 warnings: list[str] | None = None, keep_accepted: bool = False) -> Outcome:
        conditions: dict[str, dict[str, Any]] = {}
        old_conditions = {c.get("type"): c for c in old.get("conditions") or []}
        if accepted is not None:
            conditions["Accepted"] = _condition("Accepted", *accepted, generation)
        elif keep_accepted and "Accepted" in old_conditions:
            conditions["Accepted"] = old_conditions["Accepted"]
        conditions["Synced"] = _condition("Synced", *(synced or (True, "Synced", "the control plane answered")),
                                          generation)
        phase = status.get("phase")
        ready_ok = phase == "Ready" and status.get("version") is not None and accepted is not None and accepted[0]
        conditions["Ready"] = _condition("Ready", ready_ok if synced is None else None,
                                         str(phase or "Unknown"), status.get("reason") or str(phase or ""), generation)
        if warnings is not None:
            conditions["Warnings"] = _condition("Warnings", bool(warnings), "SpecWarnings" if warnings else "None",
                                                "; ".join(warnings) or "SIE honours every field", generation)
        events: list[tuple[str, str, str]] = []
        for kind, cond in conditions.items():
            before = old_conditions.get(kind)
            same = before is not None and (before.get("status"), before.get("reason"), before.get("message")) == \
                (cond["status"], cond["reason"], cond["message"])
            cond["lastTransitionTime"] = before["lastTransitionTime"] if (
                before is not None and before.get("status") == cond["status"]) else _now()
            if same:
                continue
            if kind == "Accepted" and cond["status"] == "False":
                events.append(("Warning", cond["reason"], cond["message"]))
            elif kind == "Warnings" and cond["status"] == "True":
                events.append(("Warning", "SpecWarnings", cond["message"]))
            elif kind == "Ready" and before is not None and cond["status"] != "Unknown":
                # a model on its way (Pending, Progressing: starting, scaling, rolling out) is normal progress;
                # Warning is for what needs a look (Degraded, Unschedulable, Invalid)
                normal = cond["status"] == "True" or phase in NORMAL_PHASES
                events.append(("Normal" if normal else "Warning", f"Phase{phase}",
                               f"{status.get('ready', '')} ready; {cond['message']}".strip()))
            elif kind == "Synced" and cond["status"] == "False":
                events.append(("Warning", cond["reason"], cond["message"]))
        status["conditions"] = list(conditions.values())
        return Outcome(status=status, events=events)


#: phases a model passes through when all goes well: their Events are Normal
NORMAL_PHASES = frozenset({"Ready", "Pending", "Progressing"})


def _now() -> str:
    return dt.datetime.now(dt.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def same_status(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Equal for the purpose of writing: ignore condition timestamps (they only change with a status)."""
    def strip(s: dict[str, Any]) -> dict[str, Any]:
        out = dict(s)
        out["conditions"] = [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in s.get("conditions") or []]
        return out

    return strip(a) == strip(b)


# ------------------------------------------------------------------------------------------ the loop


class Operator:
    """list+watch -> queue -> reconcile, while holding the Lease."""

    def __init__(self, kube: Any, control: ControlClient, settings: Settings, *, namespaces: list[str],
                 identity: str, lease_namespace: str, lease_name: str = "sie-operator", resync_s: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from kubernetes import client

        from sie.k8s.lease import LeaseElector

        self.custom = client.CustomObjectsApi(kube)
        self.core = client.CoreV1Api(kube)
        self.namespaces, self.identity, self.resync_s = namespaces, identity, resync_s
        self.reconciler = Reconciler(control, settings.topic_prefix)
        self.lease = LeaseElector(client.CoordinationV1Api(kube), lease_namespace, lease_name, identity, clock=clock)
        self._clock = clock
        self._dirty: set[tuple[str, str]] = set()
        self._retry: dict[tuple[str, str], tuple[float, float]] = {}  # key -> (due, backoff)
        self._wake = threading.Condition()
        self._stop = threading.Event()
        self._next_resync = 0.0
        self.passes = 0
        #: the main loop's last turn (clock()): /healthz fails when it stops turning
        self.last_loop = clock()

    # -- watch ----------------------------------------------------------------------------------------

    def _watch(self, namespace: str) -> None:
        from kubernetes import watch
        from kubernetes.client import ApiException

        backoff = 0.5
        while not self._stop.is_set():
            try:
                listed = cast(dict[str, Any], self.custom.list_namespaced_custom_object(  # a JSON object
                    GROUP, VERSION, namespace, PLURAL))
                self._mark((namespace, item["metadata"]["name"]) for item in listed.get("items", []))
                rv = listed["metadata"]["resourceVersion"]
                w = watch.Watch()
                for event in w.stream(self.custom.list_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL,
                                      resource_version=rv, timeout_seconds=60, allow_watch_bookmarks=True):
                    if self._stop.is_set():
                        w.stop()
                        break
                    obj = event.get("object") or {}
                    if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                        self._mark([(namespace, obj["metadata"]["name"])])
                backoff = 0.5
            except ApiException as exc:
                if exc.status != 410:  # 410 Gone: our resourceVersion is too old; relist at once
                    log.warning("watch of %s/%s failed (%s %s); again in %.1fs", namespace, PLURAL, exc.status,
                                exc.reason, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
            except Exception as exc:  # connection refused/reset while the API server restarts
                log.warning("watch of %s/%s broke (%s: %s); again in %.1fs", namespace, PLURAL,
                            type(exc).__name__, exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, 30.0)

    def _mark(self, keys: Any) -> None:
        with self._wake:
            self._dirty.update(keys)
            self._wake.notify_all()

    # -- main loop ------------------------------------------------------------------------------------

    def stop(self) -> None:
        self._stop.set()
        with self._wake:
            self._wake.notify_all()

    def run(self) -> None:
        threads = [threading.Thread(target=self._watch, args=(ns,), name=f"sie-operator-watch-{ns}", daemon=True)
                   for ns in self.namespaces]
        for t in threads:
            t.start()
        log.info("operator %s watching %s in %s", self.identity, PLURAL, ", ".join(self.namespaces))
        next_lease = 0.0
        try:
            while not self._stop.is_set():
                now = self._clock()
                self.last_loop = now
                if now >= next_lease:
                    self.lease.step()
                    next_lease = now + self.lease.retry_s
                if self.lease.leading:
                    self.pass_once(now)
                with self._wake:
                    if not self.lease.leading:  # a follower only renews its bid; the watch keeps marking keys
                        self._wake.wait(max(0.05, next_lease - self._clock()))
                    elif not self._dirty:
                        due = [next_lease, self._next_resync, *(d for d, _ in self._retry.values())]
                        self._wake.wait(max(0.05, min(due) - self._clock()))
        finally:
            self.lease.release()

    def pass_once(self, now: float) -> None:
        """Reconcile what is due: every CR at a resync, else the changed ones and the due retries."""
        with self._wake:
            keys = set(self._dirty)
            self._dirty.clear()
        keys |= {k for k, (due, _) in self._retry.items() if due <= now}
        items = None
        if now >= self._next_resync:
            items = self._list_all()
            if items is not None:
                keys |= set(items)
                self._next_resync = now + self.resync_s
        if not keys:
            return
        if items is None:
            items = self._list_all()
            if items is None:
                with self._wake:
                    self._dirty |= keys
                return
        owners = self._owners(items)
        for key in sorted(keys):
            if not self.lease.leading or self._stop.is_set():
                with self._wake:
                    self._dirty.add(key)
                continue
            cr = items.get(key)
            if cr is None:
                self._retry.pop(key, None)  # gone (the finalizer was already removed)
                continue
            ok = self.reconcile_one(cr, owners)
            if ok:
                self._retry.pop(key, None)
            else:
                _, backoff = self._retry.get(key, (0.0, 1.0))
                self._retry[key] = (self._clock() + backoff, min(backoff * 2, 60.0))
        self.passes += 1

    def _list_all(self) -> dict[tuple[str, str], dict[str, Any]] | None:
        out: dict[tuple[str, str], dict[str, Any]] = {}
        try:
            for ns in self.namespaces:
                listed = cast(dict[str, Any], self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL))
                for item in listed.get("items", []):
                    out[(ns, item["metadata"]["name"])] = item
        except Exception as exc:
            log.warning("cannot list %s (%s: %s)", PLURAL, type(exc).__name__, exc)
            return None
        return out

    @staticmethod
    def _owners(items: dict[tuple[str, str], dict[str, Any]]) -> dict[str, str]:
        """model name -> namespace/name of the oldest live CR that declares it."""
        best: dict[str, tuple[str, str]] = {}
        for (ns, name), cr in items.items():
            if cr["metadata"].get("deletionTimestamp"):
                continue
            created = cr["metadata"].get("creationTimestamp") or ""
            if name not in best or (created, ns) < best[name]:
                best[name] = (created, ns)
        return {name: f"{ns}/{name}" for name, (_, ns) in best.items()}

    def reconcile_one(self, cr: dict[str, Any], owners: dict[str, str]) -> bool:
        """One CR; False when it should be retried soon (a call failed)."""
        from kubernetes.client import ApiException

        meta = cr["metadata"]
        ns, name = meta["namespace"], meta["name"]
        try:
            if meta.get("deletionTimestamp"):
                return self._finalize(cr, owners)
            if FINALIZER not in (meta.get("finalizers") or []):
                self._patch_meta(cr, [*(meta.get("finalizers") or []), FINALIZER])
                return True  # the write wakes the watch: the next pass reconciles the new version
            owner = owners.get(name)
            outcome = self.reconciler.reconcile(cr, None if owner in (None, f"{ns}/{name}") else owner)
            old = cr.get("status") or {}
            if not same_status(old, outcome.status):
                self.custom.patch_namespaced_custom_object_status(GROUP, VERSION, ns, PLURAL, name,
                                                                  {"status": outcome.status})
            for etype, reason, message in outcome.events:
                self._event(cr, etype, reason, message)
            return not outcome.retry
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted or changed under us: the watch brings the new version
                return True
            log.warning("%s/%s: API server said %s %s", ns, name, exc.status, exc.reason)
            return False
        except Exception as exc:
            log.exception("%s/%s: reconcile failed (%s)", ns, name, type(exc).__name__)
            return False

    def _finalize(self, cr: dict[str, Any], owners: dict[str, str]) -> bool:
        meta = cr["metadata"]
        ns, name = meta["namespace"], meta["name"]
        finalizers = meta.get("finalizers") or []
        if FINALIZER not in finalizers:
            return True
        owner = owners.get(name)
        if owner is None or owner == f"{ns}/{name}":  # a Conflict loser never owned the model: leave it alone
            control = self.reconciler.control
            try:
                view = control.model(name)
                applied = (view or {}).get("spec") or {}
                mark = owner_mark(cr)
                if applied.get("owner") == mark or applied_before_marks(cr.get("status") or {}, applied):
                    deleted = control.delete(name, owner=applied.get("owner"))
                else:  # never applied by this CR (refused, or another owner's): nothing of it to delete
                    deleted = False
                    if applied:
                        self._event(cr, "Normal", "NotOwner", f"model {name} is managed by "
                                    f"{applied.get('owner') or 'sie apply or the API'}; left in SIE")
            except ControlUnavailable as exc:
                self._event(cr, "Warning", "ControlPlaneUnavailable", f"cannot delete the model yet: {exc}")
                return False
            except ControlRefused as exc:
                if exc.status != 409:
                    self._event(cr, "Warning", "DeleteRefused", str(exc))
                    return False
                deleted = False  # the mark changed under us: no longer ours to delete
                self._event(cr, "Normal", "NotOwner", str(exc))
            if deleted:
                self._event(cr, "Normal", "Deleted", f"model {name} deleted from SIE (its replicas drain)")
        self._patch_meta(cr, [f for f in finalizers if f != FINALIZER])
        return True

    def _patch_meta(self, cr: dict[str, Any], finalizers: list[str]) -> None:
        meta = cr["metadata"]
        # resourceVersion makes it conditional: a concurrent change to the finalizers is not overwritten
        body = {"metadata": {"finalizers": finalizers, "resourceVersion": meta["resourceVersion"]}}
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, meta["namespace"], PLURAL, meta["name"], body)

    def _event(self, cr: dict[str, Any], etype: str, reason: str, message: str) -> None:
        from kubernetes import client

        meta = cr["metadata"]
        now = dt.datetime.now(dt.UTC)
        event = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
            involved_object=client.V1ObjectReference(api_version=API_VERSION, kind=KIND, name=meta["name"],
                                                     namespace=meta["namespace"], uid=meta.get("uid"),
                                                     resource_version=meta.get("resourceVersion")),
            reason=reason[:128], message=message[:1024], type=etype, count=1, first_timestamp=now,
            last_timestamp=now, source=client.V1EventSource(component="sie-operator"),
            reporting_component="sie.lmsys.org/operator", reporting_instance=self.identity[:128])
        try:
            self.core.create_namespaced_event(meta["namespace"], event)
        except Exception as exc:  # an Event is best effort; the condition already says it
            log.warning("event %s for %s/%s not written (%s)", reason, meta["namespace"], meta["name"], exc)
        log.info("%s/%s %s %s: %s", meta["namespace"], meta["name"], etype, reason, message)


def kube_client(kubeconfig: str | None = None) -> Any:
    """An ApiClient: in a pod from its service account, else from ``kubeconfig`` / KUBECONFIG."""
    import os

    from kubernetes import client, config

    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return client.ApiClient()
    return config.new_client_from_config(config_file=kubeconfig)
