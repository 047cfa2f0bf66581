"""LLM requests through Kafka at server speed: a continuous in-flight window over an endpoint pool.

* ``protocols`` SGLang native and OpenAI-compatible request bodies and answers, output mapping;
* ``pool``      endpoints with concurrency, ejection with backoff, key-sticky choice;
* ``dispatch``  C worker threads on one keep-alive httpx client, re-dispatching on endpoint failures;
* ``quota``     per-caller requests/s and tokens/s, policy reject (per replica);
* ``window``    records in flight per partition; the contiguous finished prefix is what commits;
* ``stage``     ``LLMScorer``: the Kafka loop committing that prefix through ``sie.streams.eos``.

``docs/llm.md`` describes the whole; ``sie score`` runs it for specs whose backend names endpoints.
"""
