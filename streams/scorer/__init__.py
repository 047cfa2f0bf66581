"""The exactly-once scorer: a model's request topic -> micro-batched inference -> results / dead letters.

    from sie.streams.scorer import ScorerConfig, RoutingTable, run_scorer
    summary = run_scorer(config, backend_factory, stop_event)

See ``loop.py`` for what one batch means (the cycle itself is ``sie.streams.eos``)
and ``docs/scoring.md`` for the wire contract.
"""

from sie.streams.scorer.codec import Codec, Poison, Request, default_id
from sie.streams.scorer.config import ScorerConfig, default_instance
from sie.streams.scorer.errors import BackendUnavailable, DeadLetterReason, ScorerError
from sie.streams.scorer.inference import Inference, InferenceFailed, canary_row, infer_isolating
from sie.streams.scorer.loop import Scorer, ScorerSummary, run_scorer
from sie.streams.scorer.metrics import ScorerMetrics
from sie.streams.scorer.routing import BUCKETS, RouteEntry, RoutingTable

__all__ = [
    "BUCKETS", "BackendUnavailable", "Codec", "DeadLetterReason", "Inference", "InferenceFailed", "Poison",
    "Request", "RouteEntry", "RoutingTable", "Scorer", "ScorerConfig", "ScorerError", "ScorerMetrics",
    "ScorerSummary", "canary_row", "default_id", "default_instance", "infer_isolating", "run_scorer",
]
