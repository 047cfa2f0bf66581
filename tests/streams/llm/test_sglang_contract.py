"""The adapter's launch command and request bodies against SGLang's own code, pinned.

``tests/fixtures/sglang_contract.json`` is extracted by ``scripts/sglang_contract.py`` from the sglang
wheel (``ast`` only: importing sglang needs its CUDA stack): the flags ``ServerArgs`` accepts, the fields of
``GenerateReqInput`` and ``SamplingParams``, and of the OpenAI ``CompletionRequest`` /
``ChatCompletionRequest`` / ``ResponseFormat``.  A key SIE sends that SGLang does not define would be
refused (pydantic/msgspec) or silently ignored by the server: these tests name it.  Re-extract the
fixture for a new SGLang version and run them again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sie.streams.llm.protocols import LLMMapping, Protocol
from sie.workers.backends.base import BackendConfig, FieldRef
from sie.workers.backends.sglang_backend import SGLangBackend
from sie.workers.sglang_launcher import build_launch

CONTRACT = json.loads((Path(__file__).resolve().parents[2] / "fixtures" / "sglang_contract.json").read_text())
JSON_OUT = [("score", "float"), ("label", "string")]


def test_the_pin_is_a_real_extraction():
    assert CONTRACT["sglang_version"] == "0.5.23"
    assert len(CONTRACT["server_flags"]) > 300 and "text" in CONTRACT["generate_fields"]


def test_every_launch_flag_is_one_serverargs_parses():
    config = BackendConfig(type="sglang", model_path="Qwen/Qwen2-7B-Instruct", model_id="m:1",
                           config={"gpu_indices": [0, 1], "gpu_memory_mb": 30_000, "tp_size": 2, "max_seq_len": 4096,
                                   "served_model_name": "qwen"},
                           output_fields=(FieldRef("score", "float"),))
    argv = list(build_launch(config, port=31000, free_mb=lambda _i: 60_000, python=sys.executable).argv)
    cpu = BackendConfig(type="sglang", model_path="m", model_id="m:1", config={"mem_fraction_static": 0.3})
    argv += list(build_launch(cpu, port=31001, free_mb=lambda _i: None, python=sys.executable).argv)
    flags = {a for a in argv if a.startswith("--")}
    assert flags >= {"--model-path", "--tp-size", "--mem-fraction-static", "--served-model-name"}
    assert flags - set(CONTRACT["server_flags"]) == set()


def test_the_generate_body_is_a_generate_req_input_with_known_sampling_params():
    window = Protocol("sglang", LLMMapping(JSON_OUT, {}), {"sampling_params": {"stop": ["\n"], "top_p": 0.9}})
    streamed = Protocol("sglang", LLMMapping(JSON_OUT, {}), {"stream": True})
    bodies = [window.request("prompt", "rid-1"), streamed.request("prompt", "rid-2")]
    assert bodies[1]["stream"] is True
    batch = SGLangBackend(BackendConfig(type="sglang", model_path="m", model_id="m:1", config={},
                                        output_fields=(FieldRef("score", "float"),)))
    bodies.append({"text": "p", "sampling_params": batch.sampling_params, "stream": False, "rid": "r"})
    for body in bodies:
        assert set(body) - set(CONTRACT["generate_fields"]) == set()
        assert set(body["sampling_params"]) - set(CONTRACT["sampling_params"]) == set()
        assert isinstance(body["sampling_params"]["json_schema"], str)  # SamplingParams.json_schema: Optional[str]


@pytest.mark.parametrize("stream", [False, True])
def test_openai_bodies_are_completion_and_chat_requests(stream):
    cfg = {"model": "qwen", "stream": stream}
    comp = Protocol("openai-completions", LLMMapping([("answer", "string")], {}), cfg).request("p", "r")
    assert set(comp) - set(CONTRACT["completion_fields"]) == set()
    chat = Protocol("openai-chat", LLMMapping(JSON_OUT, {}), cfg).request("p", "r")
    assert set(chat) - set(CONTRACT["chat_fields"]) == set()
    assert ("stream_options" in chat) is stream  # streamed: ask for the usage chunk (OpenAI include_usage)
    fmt = chat["response_format"]
    assert set(fmt) - set(CONTRACT["response_format_fields"]) == set()
    assert set(fmt["json_schema"]) - set(CONTRACT["json_schema_format_fields"]) == set()
