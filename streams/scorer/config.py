"""ScorerConfig: every knob of one scorer process, frozen, read once at the entry point.

The librdkafka dictionaries are built here, in one place, with a comment on each
key that matters for exactly-once, liveness or bounded memory.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from sie.kernel.clients import (
    EOS_HEARTBEAT_MS,
    eos_consumer_config,
    eos_transaction_timeout_ms,
    transactional_producer_config,
)
from sie.kernel.errors import ConfigError
from sie.kernel.names import check_instance
from sie.kernel.settings import Settings
from sie.streams.eos import PIPELINED_DEFAULT, EosLimits

if TYPE_CHECKING:  # sie.schemas.spec imports pydantic models; only needed for typing here
    from sie.schemas.spec import ModelService


def default_instance(replica_index: int = 0) -> str:
    """``<hostname>-<replica>``: stable across restarts of the same replica, distinct between replicas."""
    host = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname()) or "host"
    return f"{host}-{replica_index}"


@dataclass(frozen=True)
class ScorerConfig:
    """Configuration of one scorer (one model, one instance).

    ``instance`` must be stable for a replica (a restarted replica reuses it, so
    its new producer fences the dead one's open transaction) and unique among
    live replicas (two live scorers sharing a ``transactional.id`` fence each other).
    """

    settings: Settings
    spec: ModelService
    instance: str
    max_batch: int = 1024  # cap of one consume/infer/transaction cycle: fewer, larger transactions drain a backlog 2x faster (bench_scoring)
    # 0 = adaptive batches: a batch is what librdkafka has already fetched (<= max_batch), never a timer: a
    # backlog gives full batches, light load one record per batch (bench_latency). > 0: linger that long.
    max_wait_ms: int = 0
    # commit batch N on a committer thread while batch N+1 is collected and prepared (sie.streams.eos.cycle):
    # the commit's round trips overlap the next batch's work.  The layer's one default for every stage
    # (cycle.PIPELINED_DEFAULT: serial, and why); `sie score --pipelined` opts in
    pipelined: bool = PIPELINED_DEFAULT
    poll_timeout_ms: int = 200  # empty-consume timeout: how quickly a stop request is seen when idle
    max_request_bytes: int | None = None  # None: settings.max_request_bytes (larger values: too_large)
    max_json_depth: int = 64  # deeper JSON nesting is a schema_violation (orjson can't write >254)
    expired_to: Literal["result", "dead_letter"] = "result"  # where requests older than sla.max_queue_time_ms go
    metrics_port: int | None = None  # Prometheus /metrics port; None = no HTTP server
    session_timeout_ms: int = 10_000  # a SIGKILLed scorer's partitions move after this long
    # KIP-345 static membership (group.instance.id = transactional.id): a restarted/moved replica takes its
    # dead predecessor's place at once instead of waiting out session_timeout_ms (bench/results/failover.txt).
    # A planned stop still leaves the group at once
    # (sie.streams.eos.transaction.leave_group): static membership only matters for a crash. Only for
    # instances whose id is unique among live scorers and stable across restarts (agent replicas).
    static_membership: bool = False
    heartbeat_interval_ms: int = EOS_HEARTBEAT_MS  # how soon members see a rebalance (clients.EOS_HEARTBEAT_MS)
    max_poll_interval_ms: int = 300_000  # one batch (consume -> commit) must finish within this
    # None: the session timeout (clients.eos_transaction_timeout_ms: a cut-off scorer's open transaction is aborted
    # about as soon as its partitions moved); > the slowest produce-and-commit, <= broker transaction.max.timeout.ms
    transaction_timeout_ms: int | None = None
    fetch_queue_kbytes: int = 16_384  # prefetch bound: memory stays bounded whatever the backlog
    # what the transactional producer may queue; None: librdkafka's default (1 GiB). A multi-model process
    # (sie.workers.multimodel) bounds it per model, since it runs one producer per model it hosts
    producer_buffer_kbytes: int | None = None
    retriable_attempts: int = 8  # bounded retries of one Kafka call on a retriable error
    retry_backoff_s: float = 0.1
    backend_backoff_max_s: float = 5.0  # cap of the backoff while the backend is down
    txn_hang_limit_s: float = 25.0  # a send_offsets/commit/abort call hung this long -> new producer (librdkafka #5456)
    fatal_limit: int = 5  # consecutive fatal producer errors before giving up (Fenced)
    lag_interval_s: float = 5.0  # how often sie_consumer_lag is refreshed

    def __post_init__(self) -> None:
        checks = [
            ("max_batch", self.max_batch >= 1, ">= 1"),
            ("max_wait_ms", self.max_wait_ms >= 0, ">= 0"),
            ("poll_timeout_ms", self.poll_timeout_ms >= 1, ">= 1"),
            ("max_request_bytes", self.request_limit >= 1, ">= 1"),
            ("max_json_depth", 1 <= self.max_json_depth <= 250, "between 1 and 250"),
            ("session_timeout_ms", self.session_timeout_ms >= 1000, ">= 1000"),
            ("heartbeat_interval_ms", 1 <= self.heartbeat_interval_ms <= self.session_timeout_ms // 3,
             "between 1 and session_timeout_ms / 3"),
            ("transaction_timeout_ms", self.transaction_timeout_ms is None or self.transaction_timeout_ms >= 1000,
             ">= 1000 or unset"),
            ("fetch_queue_kbytes", self.fetch_queue_kbytes >= 64, ">= 64"),
            # a record larger than the producer's whole queue would never fit: produce() would wait forever
            ("producer_buffer_kbytes", self.producer_buffer_kbytes is None
             or self.producer_buffer_kbytes * 1024 >= 2 * self.settings.max_record_bytes,
             f">= 2 * SIE_MAX_RECORD_BYTES / 1024 = {2 * self.settings.max_record_bytes // 1024} or unset"),
            ("retriable_attempts", self.retriable_attempts >= 1, ">= 1"),
        ]
        for name, ok, rule in checks:
            if not ok:
                raise ConfigError(f"scorer.{name}: must be {rule} (got {getattr(self, name)!r})")
        if self.expired_to not in ("result", "dead_letter"):
            raise ConfigError(f"scorer.expired_to: must be 'result' or 'dead_letter' (got {self.expired_to!r})")
        check_instance(self.instance, "scorer.instance")

    @property
    def request_limit(self) -> int:
        return self.max_request_bytes if self.max_request_bytes is not None else self.settings.max_request_bytes

    # --- derived names ----------------------------------------------------------
    @property
    def transactional_id(self) -> str:
        return self.settings.names.scorer_transactional_id(self.spec.name, self.instance)

    @property
    def group_id(self) -> str:
        return self.spec.group_id

    @property
    def auto_offset_reset(self) -> str:
        kafka_input = getattr(self.spec, "kafka_input", None)
        return getattr(kafka_input, "auto_offset_reset", None) or "earliest"

    @property
    def effective_transaction_timeout_ms(self) -> int:
        if self.transaction_timeout_ms is not None:
            return self.transaction_timeout_ms
        return eos_transaction_timeout_ms(self.session_timeout_ms)

    # --- the exactly-once layer's configuration ----------------------------------------
    def eos_limits(self) -> EosLimits:
        # a scorer that can commit nothing for a session's length gives its partitions to the others (stage.py)
        return EosLimits(attempts=self.retriable_attempts, backoff_s=self.retry_backoff_s,
                         fatal_limit=self.fatal_limit, retry_later_max_s=self.backend_backoff_max_s,
                         hang_limit_s=self.txn_hang_limit_s, stall_s=self.session_timeout_ms / 1000)

    def consumer_config(self) -> dict[str, Any]:
        return eos_consumer_config(
            self.settings, self.group_id, self.settings.names.stage_client_id(self.transactional_id, "consumer"),
            max_batch=self.max_batch,
            session_timeout_ms=self.session_timeout_ms, max_poll_interval_ms=self.max_poll_interval_ms,
            fetch_queue_kbytes=self.fetch_queue_kbytes, auto_offset_reset=self.auto_offset_reset,
            group_instance_id=self.transactional_id if self.static_membership else None,
            heartbeat_interval_ms=self.heartbeat_interval_ms,
        )

    def producer_config(self) -> dict[str, Any]:
        return transactional_producer_config(self.settings, self.transactional_id, max_batch=self.max_batch,
                                             transaction_timeout_ms=self.effective_transaction_timeout_ms,
                                             buffer_kbytes=self.producer_buffer_kbytes)
