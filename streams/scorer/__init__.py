"""The exactly-once scorer: a model's request topic -> micro-batched inference -> results / dead letters.

    from sie.streams.scorer import ScorerConfig, RoutingTable, run_scorer
    summary = run_scorer(config, backend_factory, stop_event)

See ``loop.py`` for the batch cycle, ``transaction.py`` for the ordered commit
and ``docs/scoring.md`` for the wire contract.
"""

from sie.streams.scorer.codec import Codec, Poison, Request, default_id
from sie.streams.scorer.config import INSTANCE_RE, ScorerConfig, default_instance
from sie.streams.scorer.errors import (
    BackendUnavailable,
    DeadLetterReason,
    ProducerFatal,
    ScorerError,
    ScorerFenced,
    TxnAbortable,
)
from sie.streams.scorer.loop import InferenceFailed, Scorer, ScorerSummary, infer_isolating, run_scorer
from sie.streams.scorer.metrics import ScorerMetrics
from sie.streams.scorer.routing import BUCKETS, RouteEntry, RoutingTable

__all__ = [
    "BUCKETS", "INSTANCE_RE", "BackendUnavailable", "Codec", "DeadLetterReason", "InferenceFailed", "Poison",
    "ProducerFatal", "Request", "RouteEntry", "RoutingTable", "Scorer", "ScorerConfig", "ScorerError",
    "ScorerFenced", "ScorerMetrics", "ScorerSummary", "TxnAbortable", "default_id", "default_instance",
    "infer_isolating", "run_scorer",
]
