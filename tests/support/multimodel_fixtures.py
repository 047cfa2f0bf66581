"""A multi-model worker process (``python -m sie.workers.multimodel``) as a child process, for the Kafka tests
and bench/bench_density.py."""

from __future__ import annotations

import json
import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from sie.workers.multimodel.desired import HEALTH_FILE, DesiredModel, write_desired
from tests.support.scorer_fixtures import ALLOWED_MODULES, LoggedProcess, echo_version_spec


def echo_model(callable_name: str = "echo", name: str | None = None) -> Any:
    """A parsed echo-family spec with a unique name (its own topics and group)."""
    return echo_version_spec(name or f"sh-{uuid.uuid4().hex[:10]}", "1.0.0", callable_name)


class SharedHostProcess(LoggedProcess):
    """The real entry point in a child process; ``health()`` reads its health.json."""

    def __init__(self, state_dir: Path, bootstrap: str, *extra: str, env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        state_dir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "SIE_BOOTSTRAP_SERVERS": bootstrap,
               "SIE_ALLOWED_MODULES": ",".join(ALLOWED_MODULES), **(env or {})}
        cmd = [sys.executable, "-m", "sie.workers.multimodel", "--state-dir", str(state_dir), "--interval", "0.2",
               "--log-level", "warning", *extra]
        super().__init__(cmd, state_dir / f"host-{time.monotonic_ns()}.log", env)

    def set_models(self, models: list[tuple[str, Any]]) -> None:
        """(replica id, parsed spec) pairs: the desired-models file, rewritten atomically."""
        write_desired(self.state_dir, [DesiredModel(rid, spec.to_document()) for rid, spec in models])

    def health(self) -> dict[str, Any]:
        if self.proc.poll() is not None:
            raise AssertionError(f"host exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
        try:
            doc = json.loads((self.state_dir / HEALTH_FILE).read_text())
        except (FileNotFoundError, ValueError):
            return {"lanes": {}, "pid": None}
        return doc if doc.get("pid") == self.proc.pid else {"lanes": {}, "pid": None}  # not a predecessor's

    def ready(self, replica_ids: list[str]) -> bool:
        lanes = self.health()["lanes"]
        return all(lanes.get(rid, {}).get("state") == "READY" for rid in replica_ids)
