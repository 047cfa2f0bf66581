"""The other version of a rollout, served by a replica from a process of its own (a *companion*).

WHY a process per version (measured and compared in docs/rollouts.md, "Version isolation"): during a rollout
every replica of a model answers both versions (the key-sticky split is made inside each batch, which keeps
KIP-447 fencing and one transaction per batch).  Loaded into one interpreter, two builds of a python model
are ONE module (``import churnpkg`` runs once: results labelled 1.3.0 would come from 1.1.0's code), and
a version that crashes, hangs or exhausts memory takes the replica, hence the stable version, with it.  In a
process of its own a version has its own imports, its own memory, and can be killed alone.

What the worker's ``ProcessVersions`` does for each companion, level-triggered from the scorer's batch
boundary (``RolloutScorer.apply_latest`` asks ``backend(version, spec)``, which never blocks)::

    waiting   its prepared document is not there yet: the agent prepares it exactly as it prepares a
              dedicated replica of that version (``sie.workers.prepare``: policy, artifacts fetched and
              verified, module archive checked) into ``version-<v>.json`` in the replica's folder
              (``sie score`` prepares it itself, with the same function)
    loading   ``python -m sie.workers.version_host`` started (PR_SET_PDEATHSIG: it dies with the worker);
              it checks the policy again, loads the backend and proves it with the readiness inference
    ready     its backend answers the batches routed to it, over two pipes (``VersionHost.infer``)
    failed    it could not be prepared or loaded (the reason: the agent's refusal, the load error with the
              tail of its log), or it was lost too often; the replica holds no partitions while it routes to it

Failures and what happens next:

| what happens                                        | state              | next                                   |
|-----------------------------------------------------|--------------------|----------------------------------------|
| the agent has not prepared it yet                   | waiting            | asked again at the next batch           |
| prepare refused (policy, artifact bytes, archive)   | failed             | until the rollout names another spec    |
| load / readiness inference failed                   | failed             | same (a code error does not heal)       |
| not ready within ``companion_load_timeout_s``       | failed             | same                                    |
| died or no answer within ``companion_call_timeout_s`` | lost -> loading  | restarted after a backoff (1, 2, 4 s)   |
| lost ``MAX_LOSSES`` times within ``LOSS_WINDOW_S``  | failed             | same                                    |

The leader sees these states in heartbeats (``ReplicaReport.versions``): a canary that is not ready on every
replica does not get traffic (and a replica whose table names a version not ready on it serves nothing:
``sie.streams.scorer.rollout``), and one that failed or was lost rolls the rollout back (docs/rollouts.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from sie.kernel.settings import companion_environment
from sie.streams.scorer.errors import VersionLost
from sie.workers.backends import InferenceError
from sie.workers.process import LaunchDeferred, LaunchRefused, describe_exit, pdeathsig_preexec

log = logging.getLogger("sie.versions")

#: the entry point of a companion version's process
HOST_MODULE = "sie.workers.version_host"
#: losses (a death or a hang) after which a companion is failed for the rest of the rollout ...
MAX_LOSSES = 3
#: ... when they fall within this window (older losses are forgotten)
LOSS_WINDOW_S = 300.0
_BACKOFF_S = (1.0, 2.0, 4.0)
_SAFE_VERSION = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._+-")


def prepared_file(directory: Path, version: str) -> Path:
    """Where a replica's companion document for ``version`` lives (the agent writes it, the worker reads it);
    ValueError for a version string that cannot be part of a file name."""
    if not version or len(version) > 64 or not set(version) <= _SAFE_VERSION or version.startswith("."):
        raise ValueError(f"version {version[:80]!r}: not a valid version (letters, digits, '._+-', at most 64)")
    return directory / f"version-{version}.json"


def document_key(spec_doc: Mapping[str, Any]) -> str:
    """A stable identity of a spec document (a companion whose document changes is prepared and loaded anew)."""
    return hashlib.sha256(json.dumps(dict(spec_doc), sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


class PreparedSource(Protocol):
    """Where a companion's prepared document comes from."""

    def prepared(self, version: str, spec_doc: Mapping[str, Any]) -> Path | None:
        """The prepared document's path, or None while it is not there (``waiting`` says why);
        ``LaunchRefused`` when it never will be."""

    def waiting(self, version: str) -> str: ...


class AgentPrepared:
    """Companion documents the node agent prepared into the replica's folder (``prepare_companions``)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def prepared(self, version: str, spec_doc: Mapping[str, Any]) -> Path | None:
        path = prepared_file(self.directory, version)
        if not path.is_file():
            return None
        try:
            doc = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None  # being written (the agent replaces it atomically) or gone: ask again later
        if not isinstance(doc, dict) or doc.get("name") != spec_doc.get("name") or doc.get("version") != version:
            raise LaunchRefused(f"{path.name} names {doc.get('name') if isinstance(doc, dict) else '?'} "
                                f"{doc.get('version') if isinstance(doc, dict) else '?'}, not the rollout's "
                                f"{spec_doc.get('name')} {version}")
        return path

    def waiting(self, version: str) -> str:
        return "waiting for the agent to prepare it"


class SelfPrepared:
    """Companion documents prepared by this process with the node's own preparation (``sie score``, where no
    agent runs): ``prepare_spec`` with this process's policy and artifact fetcher, written to ``directory``."""

    def __init__(self, directory: Path, policy: Any, artifacts: Any) -> None:
        self.directory = directory
        self.policy = policy
        self.artifacts = artifacts
        self._why: dict[str, str] = {}

    def prepared(self, version: str, spec_doc: Mapping[str, Any]) -> Path | None:
        from sie.workers.prepare import prepare_spec

        path = prepared_file(self.directory, version)
        try:
            doc = prepare_spec(dict(spec_doc), self.policy, self.artifacts)
        except LaunchDeferred as exc:
            self._why[version] = str(exc)
            return None
        write_document(path, doc)
        return path

    def waiting(self, version: str) -> str:
        return self._why.get(version, "being prepared")


def write_document(path: Path, doc: Mapping[str, Any]) -> None:
    """Write a prepared document atomically (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(dict(doc), indent=1), encoding="utf-8")
    os.replace(tmp, path)


class VersionHost:
    """The worker's handle on one companion's process (``sie.workers.version_host``): a ``Backend``.

    ``start`` spawns it (from the calling thread, which must outlive it: PR_SET_PDEATHSIG); a reader thread
    takes its events and answers.  ``infer`` sends one batch and waits at most ``call_timeout_s`` for its
    answer: a dead process or a missed deadline raises ``VersionLost`` (and the process is killed); an
    answer that says the call failed raises ``InferenceError`` (the scorer bisects, as for any backend)."""

    device = "cpu"

    def __init__(self, version: str, spec_file: Path, label: str, *, log_path: Path,
                 call_timeout_s: float, python: str = sys.executable, env: Mapping[str, str] | None = None,
                 gpu_indices: Iterable[int] = (), gpu_memory_mb: int = 0, threads: int | None = None) -> None:
        self.version = version
        self.spec_file = spec_file
        self.label = label
        self.log_path = log_path
        self.call_timeout_s = call_timeout_s
        self._python = python
        # an allow-list of the worker's environment, never all of it (its Kafka credentials stay in the worker)
        self._env = dict(env) if env is not None else companion_environment(os.environ)
        self._gpu = (",".join(str(i) for i in gpu_indices), gpu_memory_mb)
        self._threads = threads
        self.state = "loading"
        self.detail = ""
        self.readiness_ms: float | None = None
        self._popen: subprocess.Popen[bytes] | None = None
        self._req: int | None = None
        self._answers: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self._lock = threading.Lock()
        self._n = 0
        self.started_at = 0.0

    @property
    def pid(self) -> int | None:
        return self._popen.pid if self._popen is not None else None

    def start(self) -> None:
        req_r, req_w = os.pipe()
        out_r, out_w = os.pipe()
        argv = [self._python, "-P", "-m", HOST_MODULE, "--spec-file", str(self.spec_file), "--label", self.label,
                "--in-fd", str(req_r), "--out-fd", str(out_w), "--gpu-indices", self._gpu[0],
                "--gpu-memory-mb", str(self._gpu[1]), *(("--threads", str(self._threads)) if self._threads else ())]
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            with open(self.log_path, "ab") as log_file:
                self._popen = subprocess.Popen(
                    argv, env=self._env, cwd=str(self.log_path.parent), stdin=subprocess.DEVNULL, stdout=log_file,
                    stderr=subprocess.STDOUT, pass_fds=(req_r, out_w), preexec_fn=pdeathsig_preexec(os.getpid()))
        except OSError:
            os.close(req_w)
            os.close(out_r)
            raise
        finally:
            os.close(req_r)
            os.close(out_w)
        self._req = req_w
        self.started_at = time.monotonic()
        threading.Thread(target=self._read, args=(out_r,), name=f"version-{self.version}", daemon=True).start()

    def _read(self, fd: int) -> None:
        import orjson

        with os.fdopen(fd, "rb") as stream:
            for line in iter(stream.readline, b""):
                try:
                    doc = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(doc, dict):
                    continue
                event = doc.get("event")
                if event == "ready":
                    latency = doc.get("latency_ms")
                    numeric = isinstance(latency, int | float) and not isinstance(latency, bool)
                    self.readiness_ms = float(latency) if numeric and latency is not None else None
                    self.state = "ready"
                elif event == "error":
                    self.state, self.detail = "failed", str(doc.get("detail") or "load failed")[:2000]
                elif "n" in doc:
                    self._answers.put(doc)
        self._answers.put(None)  # EOF: the process is gone
        if self.state != "failed":
            self.state, self.detail = "lost", self._exit_detail()

    def _exit_detail(self) -> str:
        popen = self._popen
        code = popen.wait(timeout=5) if popen is not None else None
        cause = describe_exit(code).cause if code is not None else "stopped answering"
        tail = self.log_tail()
        return f"process {cause}" + (f"; last log lines: {tail}" if tail else "")

    def rss_mb(self) -> int:
        """Resident memory of its process in MiB (0: none, or not readable): the agent reports it as held."""
        pid = self.pid
        if pid is None or (self._popen is not None and self._popen.poll() is not None):
            return 0
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) // 1024
        except (OSError, ValueError):
            pass
        return 0

    def log_tail(self, lines: int = 3) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - 4096))
                text = f.read().decode("utf-8", "replace")
        except OSError:
            return ""
        return " | ".join(line.strip() for line in text.strip().splitlines()[-lines:])

    # --- Backend ---------------------------------------------------------------------------------------
    def load(self) -> None:
        """Loaded in its own process (``start``); nothing to do here."""

    def infer(self, inputs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        import orjson

        with self._lock:
            if self.state != "ready" or self._req is None:
                raise VersionLost(self.version, self.detail or f"not ready ({self.state})")
            self._n += 1
            n = self._n
            deadline = time.monotonic() + self.call_timeout_s
            try:
                self._write(orjson.dumps({"n": n, "rows": inputs}, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n",
                            deadline)
                while True:
                    answer = self._answers.get(timeout=max(0.0, deadline - time.monotonic()))
                    if answer is None:
                        self._answers.put(None)
                        raise VersionLost(self.version, self.detail or "its process exited")
                    if answer.get("n") == n:
                        break
            except (queue.Empty, TimeoutError):
                self._lose(f"no answer within {self.call_timeout_s:g}s (companion_call_timeout_s): killed")
                raise VersionLost(self.version, self.detail) from None
            except OSError as exc:  # the pipe broke: the process is gone
                self._lose(f"its process is gone ({exc})")
                raise VersionLost(self.version, self.detail) from None
        if "error" in answer:
            raise InferenceError(str(answer["error"]))
        outputs = answer.get("outputs")
        if not isinstance(outputs, list):
            raise InferenceError(f"version {self.version}: answer without outputs")
        return outputs

    def _write(self, data: bytes, deadline: float) -> None:
        """All of ``data`` on the request pipe by ``deadline`` (a process that stopped reading fills the pipe)."""
        fd = self._req
        assert fd is not None
        view = memoryview(data)
        os.set_blocking(fd, False)
        while view:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("request not taken")
            _, writable, _ = select.select([], [fd], [], left)
            if not writable:
                continue
            try:
                sent = os.write(fd, view)
            except BlockingIOError:
                continue
            view = view[sent:]

    def _lose(self, detail: str) -> None:
        self.state, self.detail = "lost", detail
        self.kill()

    def kill(self) -> None:
        if self._popen is not None and self._popen.poll() is None:
            try:
                self._popen.kill()
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """EOF on its request pipe (it closes its backend and exits), SIGKILL if it has not within 5 s."""
        req, self._req = self._req, None
        if req is not None:
            try:
                os.close(req)
            except OSError:
                pass
        popen = self._popen
        if popen is not None:
            try:
                popen.wait(timeout=5)
            except subprocess.TimeoutExpired:
                popen.kill()
                popen.wait(timeout=5)
        if self.state in ("loading", "ready"):
            self.state = "stopped"


@dataclass
class _Companion:
    """What the worker knows of one companion version."""

    key: str
    state: str = "waiting"
    detail: str = ""
    host: VersionHost | None = None
    losses: list[float] = field(default_factory=list)
    next_try_at: float = 0.0
    restarts: int = 0


class ProcessVersions:
    """The worker's companions (module docstring); a ``sie.streams.scorer.rollout.VersionProvider``."""

    def __init__(self, source: PreparedSource, label: str, *, log_dir: Path, call_timeout_s: float = 10.0,
                 load_timeout_s: float = 300.0, host_factory: Callable[..., Any] = VersionHost,
                 clock: Callable[[], float] = time.monotonic, **host_options: Any) -> None:
        self.source = source
        self.label = label
        self.log_dir = log_dir
        self.call_timeout_s = call_timeout_s
        self.load_timeout_s = load_timeout_s
        self._host_factory = host_factory
        self._host_options = host_options
        self._clock = clock
        self._lock = threading.Lock()
        self._companions: dict[str, _Companion] = {}

    def backend(self, version: str, spec_doc: dict[str, Any]) -> Any | None:
        with self._lock:
            key = document_key(spec_doc)
            c = self._companions.get(version)
            if c is None or c.key != key:  # new, or the rollout names another document for it: start afresh
                if c is not None:
                    self._stop(c)
                c = self._companions[version] = _Companion(key)
            now = self._clock()
            self._refresh(c, now)
            if c.host is not None:
                return c.host if c.state == "ready" else None
            if c.state == "failed" or now < c.next_try_at:
                return None
            try:
                path = self.source.prepared(version, spec_doc)
            except (LaunchRefused, ValueError) as exc:
                self._fail(c, str(exc))
                return None
            if path is None:
                c.state, c.detail = "waiting", self.source.waiting(version)
                return None
            c.host = self._host_factory(version, path, f"{self.label} version {version}",
                                        log_path=self.log_dir / f"version-{version}.log",
                                        call_timeout_s=self.call_timeout_s, **self._host_options)
            c.state, c.detail = "loading", ""
            try:
                c.host.start()
            except OSError as exc:
                c.host = None
                self._lose(c, f"cannot start its process ({exc})", now)
            return None

    def _refresh(self, c: _Companion, now: float) -> None:
        """Take what its process did since (ready, a load error, an exit) into the companion's state."""
        host = c.host
        if host is None:
            return
        if host.state == "ready":
            c.state, c.detail = "ready", ""
        elif host.state == "loading":
            if now - host.started_at > self.load_timeout_s:
                self._fail(c, f"not ready within {self.load_timeout_s:g}s (companion_load_timeout_s)")
        elif host.state == "failed":  # the load or the readiness inference failed: code does not heal
            self._fail(c, host.detail)
        else:  # lost after it was ready: a death or a hang, retried after a backoff
            self._lose(c, host.detail, now)

    def lost(self, version: str, detail: str) -> None:
        with self._lock:
            c = self._companions.get(version)
            if c is not None:
                self._lose(c, detail, self._clock())

    def retain(self, versions: set[str]) -> None:
        with self._lock:
            for version in [v for v in self._companions if v not in versions]:
                self._stop(self._companions.pop(version))

    def report(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            now = self._clock()
            out = {}
            for version, c in self._companions.items():
                self._refresh(c, now)
                out[version] = {"state": c.state, "detail": c.detail, "restarts": c.restarts,
                                "rss_mb": c.host.rss_mb() if c.host is not None else 0}
            return out

    def close(self) -> None:
        self.retain(set())

    # --- transitions (under the lock) -------------------------------------------------------------------
    def _stop(self, c: _Companion) -> None:
        if c.host is not None:
            c.host.close()
            c.host = None

    def _fail(self, c: _Companion, detail: str) -> None:
        if c.host is not None:
            c.host.kill()
            self._stop(c)
        c.state, c.detail = "failed", detail
        log.error("%s: companion version failed: %s", self.label, detail)

    def _lose(self, c: _Companion, detail: str, now: float) -> None:
        if c.host is not None:
            c.host.kill()
            self._stop(c)
        c.losses = [t for t in c.losses if now - t < LOSS_WINDOW_S] + [now]
        if len(c.losses) >= MAX_LOSSES:
            self._fail(c, f"lost {len(c.losses)} times within {LOSS_WINDOW_S:g}s; last: {detail}")
            return
        c.restarts += 1
        c.state, c.detail = "waiting", f"lost ({detail}); restarting"
        c.next_try_at = now + _BACKOFF_S[min(len(c.losses), len(_BACKOFF_S)) - 1]
        log.warning("%s: companion version lost: %s; restarting in %.0fs", self.label, detail,
                    c.next_try_at - now)
