"""The "desired models" file: how whoever runs a multi-model process (the agent, a test, an operator) tells
it which models to host, without restarting it.

WHY a file and not an API: the writer rewrites it atomically (a temporary file, then ``os.replace``), the
process re-reads it on every reconcile tick and acts on the difference (level-triggered: a missed change is
seen at the next tick, a restarted process reads the whole wish again).  No port, no token, nothing to
authenticate: the file sits in a directory only the agent's user can write.

Format (JSON)::

    {"models": [{"replica_id": "fraud-scorer-0", "spec": {...ModelService document...},
                 "dir": "/agent/work/fraud-scorer-0"}, ...]}

``dir`` (optional): the replica's folder, where the agent prepares the other version of a rollout
(``version-<v>.json``, ``sie.workers.versions``); it is not part of the fingerprint (no restart).

``replica_id`` is the replica's stable id, as for a single-model worker: it becomes the model's
``transactional.id`` (``sie.scorer.<model>.<replica_id>``) and static group membership, so a restarted
process (or a restarted lane) fences whatever its predecessor left open.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sie.kernel.errors import ConfigError
from sie.kernel.names import check_instance

#: file names inside a multi-model process's state directory
DESIRED_FILE = "models.json"
HEALTH_FILE = "health.json"


@dataclass(frozen=True)
class DesiredModel:
    """One model the process should host."""

    replica_id: str
    spec: dict[str, Any]
    dir: str | None = None

    @property
    def fingerprint(self) -> str:
        """Changes when the spec does: a changed spec replaces the model's lane (drain, then start anew)."""
        return json.dumps(self.spec, sort_keys=True, separators=(",", ":"))


def write_atomic(path: Path, doc: Any) -> None:
    """Write ``doc`` as JSON so a reader sees the old file or the new one, never half of one."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(doc, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)


def write_desired(state_dir: Path, models: list[DesiredModel]) -> None:
    state_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(state_dir / DESIRED_FILE, {"models": [{"replica_id": m.replica_id, "spec": m.spec,
                                                         **({"dir": m.dir} if m.dir else {})} for m in models]})


def read_desired(state_dir: Path) -> dict[str, DesiredModel]:
    """The wish, by replica id ({} when there is no file yet); ``ConfigError`` naming the problem when the
    file is unreadable (the process then keeps what it hosts and reports the error in its health)."""
    path = state_dir / DESIRED_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"{path}: not JSON ({exc}); rewrite it atomically (write a temp file, then rename)") from exc
    models = doc.get("models") if isinstance(doc, dict) else None
    if not isinstance(models, list):
        raise ConfigError(f"{path}: must be an object with a 'models' list")
    wanted: dict[str, DesiredModel] = {}
    for i, entry in enumerate(models):
        if not isinstance(entry, dict) or not isinstance(entry.get("spec"), dict):
            raise ConfigError(f"{path}: models[{i}] must be an object with 'replica_id' and a 'spec' object")
        replica_id = check_instance(str(entry.get("replica_id", "")), f"{path}: models[{i}].replica_id")
        if replica_id in wanted:
            raise ConfigError(f"{path}: models[{i}].replica_id {replica_id!r} appears twice")
        folder = entry.get("dir")
        if folder is not None and (not isinstance(folder, str) or not os.path.isabs(folder)):
            raise ConfigError(f"{path}: models[{i}].dir must be an absolute path")
        wanted[replica_id] = DesiredModel(replica_id, entry["spec"], folder)
    return wanted
