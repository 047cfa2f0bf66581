"""Request bodies and answers of the three protocols, and the text -> outputs mapping."""

from __future__ import annotations

import json

import pytest

from sie.kernel.errors import ConfigError
from sie.streams.llm.config import LLMConfig, uses_window
from sie.streams.llm.protocols import BadOutput, Generation, LLMMapping, Protocol
from tests.support.llm_fixtures import llm_spec

TEXT = [("answer", "string"), ("completion_tokens", "int")]
JSON = [("score", "float"), ("label", "string")]


def test_sglang_native_body_and_answer():
    p = Protocol("sglang", LLMMapping(TEXT, {}), {"sampling_params": {"max_new_tokens": 64}})
    body = p.request("why?", "rid-1")
    assert p.path == "/generate"
    assert body == {"text": "why?", "sampling_params": {"max_new_tokens": 64, "temperature": 0.0},
                    "stream": False, "rid": "rid-1"}
    gen = p.parse({"text": "because", "meta_info": {"prompt_tokens": 3, "completion_tokens": 1,
                                                    "finish_reason": {"type": "stop"}}})
    assert (gen.text, gen.prompt_tokens, gen.completion_tokens) == ("because", 3, 1)
    assert p.mapping.outputs(gen) == {"answer": "because", "completion_tokens": 1}


def test_sglang_json_output_sends_the_schema_and_casts_fields():
    m = LLMMapping(JSON, {"output_ranges": {"score": [0, 1]}})
    p = Protocol("sglang", m, {})
    schema = json.loads(p.request("x", "r")["sampling_params"]["json_schema"])
    assert schema["properties"]["score"] == {"type": "number", "minimum": 0, "maximum": 1}
    assert m.outputs(Generation('{"score": "0.25", "label": "cat"}')) == {"score": 0.25, "label": "cat"}
    with pytest.raises(BadOutput, match="not JSON"):
        m.outputs(Generation("no json here"))
    with pytest.raises(BadOutput, match="outputs.score"):
        m.outputs(Generation('{"score": "high", "label": "cat"}'))


def test_openai_completions_and_chat_bodies_and_usage():
    comp = Protocol("openai-completions", LLMMapping(TEXT, {}), {"served_model_name": "qwen",
                                                                 "extra_body": {"top_p": 0.9}})
    assert comp.path == "/v1/completions"
    assert comp.request("hi", "r") == {"model": "qwen", "max_tokens": 128, "temperature": 0.0, "top_p": 0.9,
                                       "prompt": "hi"}
    gen = comp.parse({"choices": [{"text": "hello", "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 2}})
    assert (gen.text, gen.prompt_tokens, gen.completion_tokens) == ("hello", 1, 2)
    chat = Protocol("openai-chat", LLMMapping(JSON, {}), {})
    body = chat.request("hi", "r")
    assert chat.path == "/v1/chat/completions" and body["messages"] == [{"role": "user", "content": "hi"}]
    assert body["response_format"]["type"] == "json_schema"
    assert body["response_format"]["json_schema"]["schema"]["required"] == ["score", "label"]
    gen = chat.parse({"choices": [{"message": {"role": "assistant", "content": '{"score": 1, "label": "x"}'}}],
                      "usage": {"prompt_tokens": 5, "completion_tokens": 7}})
    assert chat.mapping.outputs(gen) == {"score": 1.0, "label": "x"} and gen.completion_tokens == 7
    with pytest.raises(BadOutput, match="no choices"):
        chat.parse({"error": "x"})


def test_prompt_template_and_its_errors_name_the_setting():
    m = LLMMapping(TEXT, {"prompt_template": "Q: {question}"})
    assert m.prompt({"question": "why"}) == "Q: why"
    with pytest.raises(BadOutput, match="prompt_template"):
        m.prompt({"other": 1})
    assert LLMMapping(TEXT, {}).prompt({"b": 1, "a": 2}) == '{"a": 2, "b": 1}'


def test_config_from_spec_and_its_errors():
    spec = llm_spec(["http://a:1/", {"url": "http://b:2", "concurrency": 32, "weight": 2}], max_concurrency=8,
                    commit_interval_ms=50)
    assert uses_window(spec)
    cfg = LLMConfig.from_backend_config(spec.backend.config)
    assert cfg.endpoints == (("http://a:1", 8, 1.0, 0), ("http://b:2", 32, 2.0, 0))
    assert cfg.capacity == 40 and cfg.pending_limit == 640 and cfg.commit_interval_s == 0.05
    with pytest.raises(ConfigError, match=r"endpoints\[0\].url"):
        LLMConfig.from_backend_config({"endpoints": ["ftp://x"]})
    with pytest.raises(ConfigError, match="protocol"):
        LLMConfig.from_backend_config({"server_url": "http://x", "protocol": "grpc"})
    with pytest.raises(ConfigError, match="endpoints"):
        LLMConfig.from_backend_config({})
    reserving = LLMConfig.from_backend_config({"endpoints": ["http://a", {"url": "http://b", "reserve_p0": 1}],
                                              "max_concurrency": 4, "reserve_p0": 2, "stream": True})
    assert [e.reserved for e in reserving.pool_endpoints()] == [2, 1] and reserving.stream
    with pytest.raises(ConfigError, match=r"endpoints\[0\].reserve_p0: must be below its concurrency 4"):
        LLMConfig.from_backend_config({"server_url": "http://x", "max_concurrency": 4, "reserve_p0": 4})
    with pytest.raises(ConfigError, match="stream: must be true or false"):
        LLMConfig.from_backend_config({"server_url": "http://x", "stream": "yes"})
