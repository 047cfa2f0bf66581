"""SGLang adapter: launch command + memory fraction, and the Backend over HTTP against the fake server.

The fake (tests/fakes/fake_sglang.py) is started through the adapter's real launch path (``server_entry``
replaces ``python -m sglang.launch_server``), so the command line, the 503-while-starting readiness wait,
the /generate mapping and crash detection are exercised end to end.  Real SGLang has NOT been run.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sie.workers.backends import BackendError, FieldRef, InferenceError, create_backend
from sie.workers.backends.base import BackendConfig
from sie.workers.backends.sglang_backend import SGLangBackend, SGLangClient, output_json_schema
from sie.workers.sglang_launcher import build_launch, compute_mem_fraction
from tests.support.helpers import REPO_ROOT

FAKE = str(REPO_ROOT / "tests" / "fakes" / "fake_sglang.py")


def sglang_config(tmp_path: Path, **config: object) -> BackendConfig:
    base = {
        "server_entry": [sys.executable, FAKE, "--starting-requests", "3"],
        "health_poll_interval_s": 0.05,
        "startup_timeout_s": 20,
        "log_path": str(tmp_path / "server.log"),
        "replica_id": "scorer-llm-0",
        "prompt_template": "Transaction: {description}. Risk as JSON.",
    }
    return BackendConfig(
        type="sglang",
        model_path="Qwen/Qwen2-7B-Instruct",
        config={**base, **config},
        input_fields=(FieldRef("description", "string"),),
        output_fields=(FieldRef("score", "float"), FieldRef("completion_tokens", "int")),
        example_input={"description": "coffee, 3.50 EUR"},
        model_id="scorer-llm:1",
    )


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[SGLangBackend]:
    b = create_backend(sglang_config(tmp_path))
    assert isinstance(b, SGLangBackend)
    try:
        yield b
    finally:
        b.close()


# --- launcher --------------------------------------------------------------------------------------------------


def test_mem_fraction_from_absolute_budget() -> None:
    assert compute_mem_fraction(20_000, 40_000, 0) == 0.5
    assert compute_mem_fraction(39_990, 40_000, 0) == 0.95  # clamped: keep room for the CUDA context
    with pytest.raises(BackendError, match=r"GPU 1 has 10000 MiB free but the replica's budget is 12000 MiB"):
        compute_mem_fraction(12_000, 10_000, 1)
    with pytest.raises(BackendError, match="gpuMemoryMb must be > 0"):
        compute_mem_fraction(0, 10_000, 0)


def test_launch_command_from_spec(tmp_path: Path) -> None:
    config = sglang_config(tmp_path, server_entry=None, gpu_indices=[2, 3], gpu_memory_mb=30_000, tp_size=2,
                           max_seq_len=4096, served_model_name="qwen")
    free = {2: 60_000, 3: 40_000}
    launch = build_launch(config, port=31000, free_mb=free.get, python="/py")
    argv = list(launch.argv)
    assert argv[:3] == ["/py", "-m", "sglang.launch_server"]
    pairs = dict(zip(argv[3::1], argv[4::1]))
    assert pairs["--model-path"] == "Qwen/Qwen2-7B-Instruct" and pairs["--host"] == "127.0.0.1"
    assert pairs["--port"] == "31000" and pairs["--tp-size"] == "2" and pairs["--context-length"] == "4096"
    assert pairs["--served-model-name"] == "qwen" and pairs["--base-gpu-id"] == "0"
    assert pairs["--mem-fraction-static"] == "0.75" and launch.mem_fraction_static == 0.75  # tightest GPU wins
    assert "--enable-metrics" in argv


def test_launch_refuses_what_it_cannot_honour(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match="tp_size=2 but only 1 GPU"):
        build_launch(sglang_config(tmp_path, gpu_indices=[0], gpu_memory_mb=1000, tp_size=2), free_mb=lambda i: 9000)
    with pytest.raises(BackendError, match="cannot measure free memory.*mem_fraction_static"):
        build_launch(sglang_config(tmp_path, gpu_indices=[0], gpu_memory_mb=1000), free_mb=lambda i: None)
    launch = build_launch(sglang_config(tmp_path, gpu_indices=[0], gpu_memory_mb=1000, mem_fraction_static=0.3),
                          free_mb=lambda i: None)
    assert launch.mem_fraction_static == 0.3


def test_json_schema_from_output_fields() -> None:
    schema = output_json_schema((FieldRef("score", "float"), FieldRef("label", "string"),
                                 FieldRef("completion_tokens", "int")), {"score": (0.0, 1.0)})
    assert schema == {"type": "object", "required": ["score", "label"], "properties": {
        "score": {"type": "number", "minimum": 0.0, "maximum": 1.0}, "label": {"type": "string"}}}


# --- backend over the fake server -----------------------------------------------------------------------------


def test_load_waits_through_503_then_generates(backend: SGLangBackend) -> None:
    backend.load()
    info = backend._client.model_info()  # noqa: SLF001 - the client is the adapter's HTTP wrapper
    assert info["model_path"] == "Qwen/Qwen2-7B-Instruct"
    server = SGLangClient(backend._client.base_url)._request("GET", "/get_server_info")  # noqa: SLF001
    assert server["health_checks"] >= 4  # 3 answered 503, then 200
    assert server["generated"] == 1  # the warm-up inference of the example input
    outputs = backend.infer([{"description": "tv, 900 EUR"}, {"description": "gift card, 500 EUR"},
                             {"description": "bread"}])
    assert len(outputs) == 3
    for row in outputs:
        assert set(row) == {"score", "completion_tokens"}
        assert isinstance(row["score"], float) and 0.0 <= row["score"] <= 1.0
        assert isinstance(row["completion_tokens"], int) and row["completion_tokens"] >= 1
    assert backend.fatal_error() is None


def test_text_mode_maps_generated_text(tmp_path: Path) -> None:
    config = sglang_config(tmp_path)
    config = BackendConfig(**{**config.__dict__, "output_fields": (FieldRef("answer", "string"),)})
    b = create_backend(config)
    try:
        b.load()
        assert b.output_mode == "text"
        assert b.infer([{"description": "x"}]) == [{"answer": "echo: Transaction: x. Risk as JSON."}]
    finally:
        b.close()


def test_missing_prompt_field_is_an_inference_error(backend: SGLangBackend) -> None:
    backend.load()
    with pytest.raises(InferenceError, match="prompt_template"):
        backend.infer([{"amount": 3}])


def test_server_crash_is_detected(backend: SGLangBackend) -> None:
    backend.load()
    SGLangClient(backend._client.base_url)._request("POST", "/crash", {})  # noqa: SLF001
    backend._server.wait(timeout=10)  # noqa: SLF001 - the fake exits right after answering
    assert "SGLang server" in backend.fatal_error() and "exited with code 3" in backend.fatal_error()
    with pytest.raises(InferenceError, match="unreachable"):
        backend.infer([{"description": "after the crash"}])


def test_server_that_dies_while_starting_fails_the_load(tmp_path: Path) -> None:
    b = create_backend(sglang_config(
        tmp_path, server_entry=[sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(2)"]))
    with pytest.raises(BackendError, match=r"exited with code 2.*CUDA out of memory"):
        b.load()
    b.close()


def test_never_healthy_times_out(tmp_path: Path) -> None:
    b = create_backend(sglang_config(tmp_path, server_entry=[sys.executable, FAKE, "--starting-requests", "100000"],
                                     startup_timeout_s=0.5))
    with pytest.raises(BackendError, match="not healthy after 0.5s"):
        b.load()
    b.close()


def test_an_openai_compatible_server_is_waited_on_at_health_and_proven_by_a_generation(tmp_path: Path) -> None:
    """``protocol: openai-completions`` (vLLM, llama.cpp): readiness polls ``/health`` (vLLM has no
    ``/health_generate``), the warm-up generation goes through ``/v1/completions`` asking for the model by the
    name the launcher serves it under (the fake, like vLLM, answers any other name 404), and rows map through
    the window's own protocol."""
    fake_llm = str(REPO_ROOT / "tests" / "fakes" / "fake_llm_server.py")
    config = sglang_config(tmp_path, protocol="openai-completions",
                           server_entry=[sys.executable, fake_llm, "--mean-s", "0.01", "--p99-s", "0.02"])
    config = BackendConfig(**{**config.__dict__, "output_fields": (FieldRef("answer", "string"),
                                                                   FieldRef("completion_tokens", "int"))})
    b = create_backend(config)
    try:
        b.load()
        assert b._health_path == "/health"  # noqa: SLF001
        rows = b.infer([{"description": "tv"}, {"description": "bread"}])
        assert [r["answer"] for r in rows] == ["echo: Transaction: tv. Risk as JSON.",
                                               "echo: Transaction: bread. Risk as JSON."]
        assert all(r["completion_tokens"] >= 1 for r in rows)
    finally:
        b.close()
