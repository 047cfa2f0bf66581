"""How the agent turns a desired replica into a worker command line (the supervisor's CommandBuilder).

The spec travels in the assignment as JSON; it is written to the agent's work
directory (one file per target hash) and the worker reads it with
``--spec-file``: no size limit on argv, and the file is there for an operator
to inspect next to the replica's log.

A replica's version is prepared by ``sie.workers.prepare.prepare`` (policy, artifacts named by content
fetched and verified by ``sie.workers.agent.artifacts``, module archive checked): the launch is deferred
while they are fetched, refused when their bytes are, and the worker's copy of the spec names the verified
files in the node's artifact cache (``artifact``, ``modulesPath``).  A companion version of a rollout is
prepared by the same function (``prepare_companions``) into ``version-<v>.json`` in the replica's folder.  Workers run with ``python -P`` in their replica folder: neither the
agent's working directory nor anything near it is on their ``sys.path``.

A CDC connector's replica (its document has ``kind: CdcConnector``) runs ``sie.connectors.worker``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sie.kernel.errors import ConfigError
from sie.kernel.names import check_replica_id
from sie.kernel.settings import Settings, worker_environment
from sie.schemas.connector_spec import is_connector_doc
from sie.workers.agent.http import rotate_log
from sie.workers.prepare import prepare, spec_of
from sie.workers.process import LaunchRefused, LaunchSpec
from sie.workers.replica import DesiredReplica
from sie.workers.worker_user import CREDENTIAL_FILE, WorkerUser, adopt

if TYPE_CHECKING:
    from sie.schemas.spec_models import ModelService

#: the entry points of the two kinds of replica process
WORKER_MODULE = "sie.workers.worker_main"
CONNECTOR_MODULE = "sie.connectors.worker"


class MetricsPorts:
    """Which /metrics port each worker of this agent binds (``sie agent --worker-metrics-ports``).

    ``"0"`` (default): any free port; the worker reports the one it bound (``ready`` status line) and
    the agent advertises it.  ``"9500-9599"``: a port of that range (a firewall can open exactly it),
    never the same for two live replicas; a replica keeps its port across restarts.  ``"off"``: none.
    """

    def __init__(self, spec: str = "0") -> None:
        text = spec.strip().lower()
        self.enabled = text != "off"
        self.range: tuple[int, int] | None = None
        if text in ("0", "off"):
            return
        low, sep, high = text.partition("-")
        try:
            first, last = int(low), int(high if sep else low)
        except ValueError:
            raise ConfigError(f"--worker-metrics-ports: expected 0, off or a range such as 9500-9599 (got {spec!r})") from None
        if not 1024 <= first <= last <= 65535:
            raise ConfigError(f"--worker-metrics-ports: the range must lie within 1024-65535 (got {spec!r})")
        self.range = (first, last)
        self._held: dict[str, int] = {}

    def port_for(self, replica_id: str, live: Iterable[str]) -> int | None:
        """The port to pass to the worker of ``replica_id`` (None: no metrics server); ``live``: the
        replica ids whose workers still run (their ports stay taken)."""
        if not self.enabled:
            return None
        if self.range is None:
            return 0
        alive = set(live) | {replica_id}
        self._held = {rid: port for rid, port in self._held.items() if rid in alive}
        if replica_id in self._held:
            return self._held[replica_id]
        taken = set(self._held.values())
        first, last = self.range
        for port in range(first, last + 1):
            if port not in taken:
                self._held[replica_id] = port
                return port
        # not LaunchRefused (that is FAILED for good): a port frees up when a replica stops, so this is a
        # crash the supervisor retries with backoff
        raise ConfigError(f"--worker-metrics-ports {first}-{last}: every port is taken by a live replica; "
                          "widen the range")


class WorkerCommandBuilder:
    """Builds ``python -m sie.workers.worker_main`` launches; GPU visibility via CUDA_VISIBLE_DEVICES."""

    def __init__(
        self,
        work_dir: Path,
        base_env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        progress_interval_s: float = 1.0,
        real_gpus: bool = True,
        settings: Settings | None = None,
        spec_policy: Any = None,
        artifacts: Any = None,
        metrics_ports: MetricsPorts | None = None,
        live_replicas: Callable[[], Iterable[str]] = tuple,
        shared_processes: int = 0,
        worker_user: WorkerUser | None = None,
    ) -> None:
        self.work_dir = work_dir
        # The agent's own settings win over whatever its environment said: workers must talk to the
        # same cluster, with the same topic prefix and security settings, as the agent that runs them
        # (with the workers' own Kafka principal when SIE_WORKER_SASL_USERNAME is set). Of the agent's own
        # environment only an allow-list reaches them (never SIE_API_TOKEN): Settings.worker_environment.
        parent = os.environ if base_env is None else base_env
        self.base_env = settings.worker_environment(parent) if settings else worker_environment(parent)
        #: workers run as this user (``sie.workers.worker_user``): they cannot read the agent's password file, so
        #: theirs is copied to a file only their uid may read, refreshed at every launch (a rotated secret)
        self.worker_user = worker_user
        self._credential_source: Path | None = None
        self._credential_text: str | None = None
        if worker_user is not None and "SIE_SASL_PASSWORD_FILE" in self.base_env:
            self._credential_source = Path(self.base_env["SIE_SASL_PASSWORD_FILE"])
            self.base_env["SIE_SASL_PASSWORD_FILE"] = str(self.credential_file)
            try:
                self.refresh_credential()
            except OSError as exc:  # at the agent's start: one line naming the file, not a traceback
                raise ConfigError(f"the workers' password file {self._credential_source}: cannot copy it for "
                                  f"SIE_WORKER_UID ({exc.strerror or exc}); check the path and that the agent "
                                  "may read it") from None
        #: ``sie.schemas.spec_policy.SpecPolicy``: a spec that breaks it is refused before any process starts
        self.spec_policy = spec_policy
        #: ``sie.workers.agent.artifacts.ArtifactFetcher``: makes artifacts named by content local
        self.artifacts = artifacts
        self.python = python
        self.progress_interval_s = progress_interval_s
        #: False with simulated GPUs: the indices name GPUs that do not exist, so hide CUDA entirely
        self.real_gpus = real_gpus
        self.metrics_ports = metrics_ports or MetricsPorts()
        self._live_replicas = live_replicas
        #: models one shared multi-model process hosts (``SIE_SHARED_PROCESSES``); 0: none is shared
        self.shared_processes = shared_processes

    @property
    def credential_file(self) -> Path:
        """The workers' copy of their Kafka password (with a worker user): owner the worker uid, mode 0400."""
        return self.work_dir / CREDENTIAL_FILE

    def refresh_credential(self) -> None:
        """Copy the workers' password file for the worker user when it changed (OSError: the agent cannot read
        it; the launch fails with that reason)."""
        if self._credential_source is None or self.worker_user is None:
            return
        text = self._credential_source.read_text(encoding="utf-8")
        if text != self._credential_text or not self.credential_file.exists():
            self.work_dir.mkdir(parents=True, exist_ok=True)
            adopt(self.work_dir, self.worker_user.uid)
            self.worker_user.write_secret(self.credential_file, text)
            self._credential_text = text

    def replica_dir(self, replica_id: str) -> Path:
        """The replica's folder: an assignment's ``replica_id`` checked by the naming module and the path proved to
        be a child of the work directory (``LaunchRefused`` otherwise: an absolute or ``../..`` id would make the
        agent write a spec, a log and start a worker anywhere)."""
        try:
            check_replica_id(replica_id, "assignment replica_id")
        except ConfigError as exc:
            raise LaunchRefused(f"replica refused: {exc}") from None
        root = self.work_dir.resolve()
        directory = (root / replica_id).resolve()
        if directory.parent != root:
            raise LaunchRefused(f"replica refused: its folder {directory} is outside the work directory {root}")
        return directory

    def __call__(self, desired: DesiredReplica) -> LaunchSpec:
        self.replica_dir(desired.replica_id)  # before anything else: a refused id never reaches the disk
        spec_doc = json.loads(desired.template_json)  # fail here (a crash with a reason), not in the worker
        module = CONNECTOR_MODULE if is_connector_doc(spec_doc) else WORKER_MODULE
        spec: ModelService | None = None
        if module == WORKER_MODULE:  # the one preparation of a version (a companion version's too)
            # the template decoded once (refused here if it is not a ModelService), handed to prepare and sharing
            spec = spec_of(spec_doc) if self.spec_policy is not None else None
            prepared = prepare(spec_doc, spec, self.spec_policy, self.artifacts)
            spec_doc, spec = prepared.document, prepared.spec
        directory = self.replica_dir(desired.replica_id)
        directory.mkdir(parents=True, exist_ok=True)
        rotate_log(directory)  # the process before keeps its log as worker.previous.log (`sie logs --previous`)
        self.refresh_credential()
        if self.worker_user is not None:  # also for a warm-pool worker, which opens the log itself
            self.worker_user.prepare_folder(directory)
            self.worker_user.prepare_log(directory / "worker.log")
        spec_file = directory / f"spec-{desired.target_hash}.json"
        spec_file.write_text(json.dumps(spec_doc, indent=1), encoding="utf-8")
        env = dict(self.base_env)
        env["PYTHONUNBUFFERED"] = "1"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in desired.gpu_indices) if self.real_gpus else ""
        env["SIE_REPLICA_ID"] = desired.replica_id
        args: tuple[str, ...] = (
            "--spec-file", str(spec_file),
            "--replica-id", desired.replica_id,
            "--progress-interval", str(self.progress_interval_s),
        )
        shared = (module == WORKER_MODULE and self.shared_processes > 0
                  and may_share(spec if spec is not None else spec_doc))
        if module == WORKER_MODULE:  # a connector replica is CPU-only and serves no /metrics of its own
            # a shared replica is served by its process's /metrics (``sie.workers.agent.shared``)
            port = None if shared else self.metrics_ports.port_for(desired.replica_id, self._live_replicas())
            args += ("--gpu-indices", ",".join(str(i) for i in desired.gpu_indices),
                     "--gpu-memory-mb", str(desired.gpu_memory_mb),
                     *(("--metrics-port", str(port)) if port is not None else ()))
        return LaunchSpec(name=desired.replica_id, argv=(self.python, "-P", "-m", module, *args), env=env,
                          cwd=str(directory), log_path=directory / "worker.log",
                          # a warm-pool worker (a scorer worker with the runtime imported) may take this launch
                          warm_args=args if module == WORKER_MODULE else None,
                          shared_spec=spec_doc if shared else None)


def may_share(spec: Any) -> bool:
    """May this model's replica run in a shared multi-model process (``may_share_process``, the rule
    placement counts memory by)?  ``spec``: the ModelService, or a document not decoded yet (one that does not
    decode never shares)."""
    from sie.schemas.spec_models import ModelService, may_share_process

    if not isinstance(spec, ModelService):
        try:
            spec = spec_of(spec)
        except LaunchRefused:
            return False
    return may_share_process(spec.priority_level, spec.backend.type, spec.resources.gpus)
