"""The window's own metrics, registered on the scorer's registry (one /metrics per scorer process).

``sie_tokens_total{model_id,kind}`` (kind: prompt|completion) counts tokens of committed results only
(a generation redone after a crash is counted once, when its result becomes visible);
``sie_llm_in_flight`` and ``sie_llm_endpoints_in_service`` are gauges; ``sie_llm_generation_seconds``
is one request's time from dispatch to answer (retries on other endpoints included);
``sie_llm_txn_seconds`` is one commit of the window's prefix (produce + offsets + commit);
``sie_llm_ttft_seconds`` is time to first token of streamed requests (send of the answering attempt
to its first text event; only with ``stream: true``); quotas with ``delay``: ``sie_llm_quota_held``
(requests held for their caller's quota now), ``sie_llm_quota_overruns_total`` (held requests sent at
the delay limits while over quota), ``sie_llm_quota_deferred_total`` (held requests moved to the
deferred topic, committed) and ``sie_llm_quota_share`` (this replica's fraction of each quota).
``sie_llm_director_decisions_total{endpoint,action}`` and ``sie_llm_endpoint_weight{endpoint}`` show the
traffic director's work.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_GEN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_TXN_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class LLMMetrics:
    def __init__(self, model_id: str, registry: CollectorRegistry) -> None:
        self.model_id = model_id
        self.tokens = Counter("sie_tokens", "Tokens of committed LLM results, by kind (prompt|completion).",
                              ["model_id", "kind"], registry=registry)
        self.in_flight = Gauge("sie_llm_in_flight", "Requests being generated now.", ["model_id"],
                               registry=registry).labels(model_id)
        self.endpoints_up = Gauge("sie_llm_endpoints_in_service", "Endpoints not ejected.", ["model_id"],
                                  registry=registry).labels(model_id)
        self.generation = Histogram("sie_llm_generation_seconds", "One request, dispatch to answer.",
                                    ["model_id"], buckets=_GEN_BUCKETS, registry=registry).labels(model_id)
        self.txn = Histogram("sie_llm_txn_seconds", "One transaction of the window's finished prefix.",
                             ["model_id"], buckets=_TXN_BUCKETS, registry=registry).labels(model_id)

        self.ttft = Histogram("sie_llm_ttft_seconds", "Streamed requests: send to the first generated text.",
                              ["model_id"], buckets=_TTFT_BUCKETS, registry=registry).labels(model_id)
        self.quota_held = Gauge("sie_llm_quota_held", "Requests held in the window for their caller's quota.",
                                ["model_id"], registry=registry).labels(model_id)
        self.quota_deferred = Counter("sie_llm_quota_deferred", "Held requests moved to the model's deferred "
                                      "topic (committed).", ["model_id"], registry=registry).labels(model_id)
        self.quota_overruns = Counter("sie_llm_quota_overruns", "Held requests sent at the delay limits while "
                                      "their caller was over quota.", ["model_id"], registry=registry).labels(model_id)
        self.quota_share = Gauge("sie_llm_quota_share", "This replica's fraction of every quota (its partitions "
                                 "/ the topic's).", ["model_id"], registry=registry).labels(model_id)
        self.director = Counter("sie_llm_director_decisions", "Traffic director decisions, by endpoint and action.",
                                ["model_id", "endpoint", "action"], registry=registry)
        self.weight = Gauge("sie_llm_endpoint_weight", "An endpoint's weight in the pool (configured x director).",
                            ["model_id", "endpoint"], registry=registry)

    def add_tokens(self, prompt: int, completion: int) -> None:
        if prompt:
            self.tokens.labels(self.model_id, "prompt").inc(prompt)
        if completion:
            self.tokens.labels(self.model_id, "completion").inc(completion)
