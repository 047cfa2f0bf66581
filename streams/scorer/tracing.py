"""The scorer's spans: one request's queue wait, inference and commit, under one ``sie.score`` span.

Only requests that arrive with a sampled ``traceparent`` (``sie.kernel.tracing``) get spans; the
others, and every request while tracing is off, cost nothing here (the scorer calls ``prepared`` only
when ``enabled``).  The result, or the dead letter, of a traced request leaves with a ``traceparent``
naming its ``sie.score`` span, so a reader of the results topic can continue the trace.

Spans are built from times the scorer measured anyway (record timestamp, batch start, the inference
call, the commit), so tracing adds no clock reads to the batch path.  A batch that aborts never calls
``committed``: its spans are never ended, hence never exported; the retried batch makes new ones.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE

from sie.kernel.tracing import Tracing, traceparent_of, with_traceparent
from sie.streams.eos import safe_headers
from sie.streams.eos.records import Output

_MS = 1_000_000  # ns per ms


class ScorerTrace:
    """Spans of one scorer (model); ``enabled`` False makes every hook unnecessary."""

    def __init__(self, tracing: Tracing, model: str) -> None:
        self.tracing = tracing
        self.enabled = tracing.enabled
        self.model = model

    def prepared(self, batch: Sequence[Any], outputs: Sequence[Output | None],
                 versions: Mapping[int, str], timing: Mapping[str, tuple[float, float, int]],
                 at_ms: float) -> list[tuple[Any, Output]]:
        """Start the spans of the traced requests of a prepared batch and stamp their outputs.

        ``outputs[i]`` answers ``batch[i]``; ``versions[i]`` is the version that scored it (absent: not
        scored: poison or expired); ``timing[version]`` = (inference start, in ms after ``at_ms``,
        inference duration in ms, rows in that call); ``at_ms``: wall time the batch was prepared.
        Returns what ``committed`` finishes."""
        tracing = self.tracing
        at_ns = int(at_ms * _MS)
        open_spans: list[tuple[Any, Output]] = []
        for i, msg in enumerate(batch):
            out = outputs[i]
            if out is None:
                continue
            parent = traceparent_of(safe_headers(msg))
            if parent is None:
                continue
            ts_type, ts = msg.timestamp()
            start_ns = at_ns if ts_type == TIMESTAMP_NOT_AVAILABLE else min(at_ns, int(ts) * _MS)
            version = versions.get(i)
            span = tracing.start(f"sie.score {self.model}", parent=parent, kind="consumer", start_ns=start_ns,
                                 attributes={"sie.model": self.model, "messaging.system": "kafka",
                                             "messaging.destination.name": msg.topic(),
                                             "messaging.kafka.partition": msg.partition(),
                                             "messaging.kafka.offset": msg.offset(),
                                             "sie.version": version or ""})
            if span is None:
                continue
            tracing.child(span, "sie.queue", start_ns, at_ns)
            if version is not None and version in timing:
                offset_ms, inference_ms, rows = timing[version]
                begin = at_ns + int(offset_ms * _MS)
                tracing.child(span, "sie.inference", begin, begin + int(inference_ms * _MS),
                              {"sie.batch_size": rows, "sie.version": version})
            out.headers = with_traceparent(out.headers, tracing.traceparent(span))
            open_spans.append((span, out))
        return open_spans

    def committed(self, open_spans: Sequence[tuple[Any, Output]], commit_s: float | None, now_ms: float) -> None:
        """The batch committed at ``now_ms`` (its commit took ``commit_s``): finish its spans."""
        end_ns = int(now_ms * _MS)
        begin_ns = end_ns - int((commit_s or 0.0) * 1000 * _MS)
        for span, out in open_spans:
            self.tracing.child(span, "sie.commit", begin_ns, end_ns)
            span.set_attribute("sie.outcome", out.kind)
            span.end(end_time=end_ns)

    def flush(self) -> None:
        if self.enabled:
            self.tracing.flush()
