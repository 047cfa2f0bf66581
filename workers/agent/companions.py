"""The agent's side of a rollout's other version: each replica's companions prepared into its folder.

During a rollout the leader's assignment names, for every replica of the model, the OTHER version's
document (``ReplicaAssignment.companions``): the replica serves it from a process of its own next to its own
version (``sie.workers.versions``).  The agent prepares it exactly as it prepares a dedicated replica of that
version, with the same function (``sie.workers.prepare.prepare_spec``: policy, artifacts named by content
fetched and verified in the background, module archive checked), and writes the result to
``<replica folder>/version-<v>.json``, where the worker picks it up.  Level-triggered, every agent pass::

    for each assigned replica and each companion document:
        prepared already (same document)          -> nothing
        prepare_spec -> LaunchDeferred (fetching) -> "waiting", asked again next pass
                     -> LaunchRefused             -> "failed" with the reason (asked again after RETRY_S)
                     -> the localized document    -> written atomically; "prepared"
    version files of versions no longer named     -> removed (the worker stops that process)

What the heartbeat says of each companion (``versions_of``): the agent's own state until it is prepared,
then the worker's (loading, ready, failed with the load error, ...).  The leader gives the canary traffic only
once every replica reports it ready, and rolls back when one reports it failed (docs/rollouts.md).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from sie.workers.prepare import prepare_spec
from sie.workers.process import LaunchDeferred, LaunchRefused
from sie.workers.versions import document_key, prepared_file, write_document

log = logging.getLogger("sie.agent.companions")

#: a refused companion is prepared again after this long (an artifact uploaded again, a policy changed)
RETRY_S = 30.0


@dataclass
class _Prep:
    key: str
    state: str  # prepared | waiting | failed
    detail: str = ""
    at: float = 0.0


class Companions:
    """Prepares every assigned replica's companion versions (module docstring)."""

    def __init__(self, commands: Any, clock: Callable[[], float] = time.monotonic) -> None:
        #: the agent's ``WorkerCommandBuilder``: its spec policy, artifact fetcher and replica folders
        self.commands = commands
        self._clock = clock
        self._preps: dict[tuple[str, str], _Prep] = {}

    def reconcile(self, replicas: Iterable[Any]) -> None:
        """One pass over the supervisor's replicas (``ActualReplica``)."""
        now = self._clock()
        seen: set[tuple[str, str]] = set()
        for actual in replicas:
            if actual.retiring:
                continue
            rid = actual.replica_id
            directory = self.commands.replica_dir(rid)
            wanted: dict[str, dict[str, Any]] = {}
            for text in actual.desired.companions:
                try:
                    doc = json.loads(text)
                    version = str(doc["version"])
                    prepared_file(directory, version)  # the version must be able to name a file
                except (ValueError, KeyError, TypeError) as exc:
                    log.error("replica %s: unusable companion document skipped (%s)", rid, exc)
                    continue
                wanted[version] = doc
            for version, doc in wanted.items():
                seen.add((rid, version))
                self._prepare(rid, directory, version, doc, now)
            if directory.is_dir():
                for path in directory.glob("version-*.json"):
                    if path.name[len("version-"):-len(".json")] not in wanted:
                        path.unlink(missing_ok=True)
        for gone in set(self._preps) - seen:
            del self._preps[gone]

    def _prepare(self, rid: str, directory: Any, version: str, doc: dict[str, Any], now: float) -> None:
        key = document_key(doc)
        prep = self._preps.get((rid, version))
        path = prepared_file(directory, version)
        if prep is not None and prep.key == key:
            if prep.state == "prepared" and path.is_file():
                return
            if prep.state == "failed" and now - prep.at < RETRY_S:
                return
        try:
            localized = prepare_spec(doc, self.commands.spec_policy, self.commands.artifacts)
        except LaunchDeferred as exc:
            self._preps[(rid, version)] = _Prep(key, "waiting", str(exc), now)
            return
        except LaunchRefused as exc:
            if prep is None or prep.state != "failed" or prep.key != key:
                log.error("replica %s: version %s refused on this node: %s", rid, version, exc)
            self._preps[(rid, version)] = _Prep(key, "failed", f"refused on this node: {exc}", now)
            return
        write_document(path, localized)
        self._preps[(rid, version)] = _Prep(key, "prepared", "", now)
        log.info("replica %s: version %s prepared (%s)", rid, version, path)

    def versions_of(self, replica_id: str, reported: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
        """What a heartbeat says of the replica's companions: the agent's state until a companion is prepared,
        then the worker's ``reported`` one."""
        out: dict[str, dict[str, str]] = {}
        for (rid, version), prep in sorted(self._preps.items()):
            if rid != replica_id:
                continue
            if prep.state != "prepared":
                out[version] = {"state": prep.state, "detail": prep.detail}
            else:
                out[version] = reported.get(version) or {"state": "waiting",
                                                         "detail": "prepared; the worker has not picked it up yet"}
        return out
