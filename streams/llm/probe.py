"""One request through the window's own sending path, without Kafka: ``sie predict`` and ``sie validate --load``
for an LLM spec whose config names running servers (``endpoints`` / ``server_url``).

    probe(spec, inputs):
        LLMConfig, LLMMapping, Protocol from spec.backend.config      # the window's, so the same request body
        one Job through a Dispatcher over the spec's endpoint pool   # the configured protocol, streamed if configured
        until it is answered, or every endpoint has failed once, or timeout_s
        answer -> outputs (the window's mapping) -> the output schema's check

| outcome | ``Probe`` |
|---|---|
| an answer whose outputs pass the schema | ``outputs``, ``generation``, ``endpoint`` |
| the server refused the request or answered something that cannot be its result | ``reason`` ``inference_error``, ``detail`` (what the window would dead-letter) |
| outputs outside the schema | ``reason`` ``output_violation`` |
| every endpoint failed (refused, reset, 404 for a wrong served name ...) or no answer in ``timeout_s`` | ``reason`` ``unreachable``, ``detail`` naming each endpoint's last error (the window would hold the request) |

Nothing here is a second client: the body, the stream reader and the answer mapping are the window's
(``dispatch``, ``protocols``); a spec that passes here sends what the scorer will send.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from sie.streams.llm.config import LLMConfig
from sie.streams.llm.dispatch import Dispatcher, Job
from sie.streams.llm.pool import EndpointPool
from sie.streams.llm.protocols import BadOutput, Generation, LLMMapping, Protocol


@dataclass(frozen=True)
class Probe:
    """What one request through the window's path got (module docstring)."""

    outputs: dict[str, Any] | None = None
    generation: Generation | None = None
    reason: str | None = None
    detail: str | None = None
    endpoint: str = ""
    seconds: float = 0.0
    first_token_ms: float | None = None
    batch: int = 1


def probe(spec: Any, inputs: Mapping[str, Any], timeout_s: float = 60.0, client: Any = None) -> Probe:
    """Send ``inputs`` as one request of ``spec`` (module docstring)."""
    from sie.schemas.validation import compile_output_check
    from sie.streams.llm.stage import output_fields

    cfg = dict(getattr(spec.backend, "config", None) or {})
    llm = LLMConfig.from_backend_config(cfg)
    mapping = LLMMapping(output_fields(spec), cfg)
    protocol = Protocol(llm.protocol, mapping, cfg)
    started = time.monotonic()
    try:
        prompt = mapping.prompt(inputs)
    except BadOutput as exc:
        return Probe(reason="inference_error", detail=str(exc))
    pool = EndpointPool(llm.pool_endpoints(), backoff_s=llm.backoff_s, backoff_max_s=llm.backoff_max_s)
    done: queue.SimpleQueue[Job] = queue.SimpleQueue()
    stop = threading.Event()
    dispatcher = Dispatcher(pool, protocol, 1, stop, on_done=done.put, is_current=lambda job: True,
                            timeout_s=llm.request_timeout_s, connect_timeout_s=llm.connect_timeout_s,
                            poison_after=llm.poison_after, client=client)
    job = Job(("probe", 0), 0, 0, None, protocol.request(prompt, f"sie-probe-{int(started * 1000)}"))
    dispatcher.start()
    try:
        dispatcher.submit(job)
        deadline = started + timeout_s
        while True:
            try:
                finished = done.get(timeout=0.05)
                break
            except queue.Empty:
                failing = pool.failing()
                if len(failing) == len(pool.endpoints) or time.monotonic() >= deadline:
                    why = "; ".join(f"{e.url}: {e.last_error}" for e in failing) or \
                          f"no answer within {timeout_s:g}s"
                    return Probe(reason="unreachable", detail=f"no endpoint answered: {why}",
                                 seconds=time.monotonic() - started)
    finally:
        stop.set()
        dispatcher.close()
    seconds = time.monotonic() - started
    first_ms = (finished.first_token - finished.sent) * 1000.0 if finished.first_token is not None else None
    answered = Probe(generation=finished.generation, endpoint=finished.endpoint, seconds=seconds,
                     first_token_ms=first_ms, batch=finished.batch)
    if finished.error is not None or finished.generation is None:
        return replace(answered, reason="inference_error", detail=finished.error or "no answer")
    try:
        outputs = mapping.outputs(finished.generation)
    except BadOutput as exc:
        return replace(answered, reason="inference_error", detail=str(exc))
    check = compile_output_check(spec.output_schema)
    if check is not None:
        try:
            outputs = check(outputs)
        except ValueError as exc:
            return replace(answered, reason="output_violation", detail=f"model {spec.name} {spec.version}: {exc}")
    return replace(answered, outputs=outputs)
