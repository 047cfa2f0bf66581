"""Validation that loads: the artifact on the CPU, ``exampleInput`` through it, the output checked.

``sie validate`` checks the document; a model whose file is a Python script renamed ``fake.pt``, whose output
is ``[B, 2]`` for one output field, or whose example scores outside a declared ``range`` passes that and only
fails under the agent (a crash loop, then a cool-down).  ``load_check`` finds all three before anything is
applied, with the same code the worker runs, under the same ``SpecPolicy`` built from the same settings
(``SIE_ALLOWED_MODULES``, ``SIE_MODEL_ROOTS``: a model the cluster would import is importable here, and one
it would refuse is refused here) (``create_backend(...).load()``: the torch backend refuses a file
that is not a TorchScript/export archive and an output shape that does not fit ``outputSchema``), then scores
``exampleInput`` and applies the scorer's own output check (``compile_output_check``).

``predict`` is one synchronous inference without Kafka (``sie predict``): the request is parsed and validated
by the scorer's codec and its result built the same way, so what it prints is what the scorer would publish
(``status: ok``) or the dead letter it would write (reason and detail).

``admission_problems`` is the same check for the control plane's admission path: it never imports code named
by the spec (a python ``callable`` or a safetensors ``moduleClass``) unless its top-level module is in
``allowed_modules`` (the rule: code named by data is imported only from an allow-list).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

#: backends that cannot be loaded on a CPU for a check (a server and a GPU): reported as skipped.  An sglang
#: spec is checked all the same when it names running servers (one real request through the configured
#: protocol: ``sie.streams.llm.probe``) or a ``server_entry`` (the node's own launcher, e.g. vLLM on CPU)
NOT_LOADABLE = {"sglang": "an sglang model needs its server and a GPU: not loaded here (the agent's readiness "
                          "inference checks it); name running servers (endpoints/server_url) or a server_entry "
                          "to have one real request checked"}


def _loadable_sglang(spec: Any) -> str | None:
    """How an sglang spec can be checked here: ``window`` (running servers), ``launch`` (a server_entry), or None."""
    from sie.streams.llm.config import uses_window

    if uses_window(spec):
        return "window"
    cfg = getattr(spec.backend, "config", None) or {}
    return "launch" if cfg.get("server_entry") else None


@dataclass(frozen=True)
class LoadReport:
    """What loading one spec found: ``problems`` (each names the field and the fix), the example's outputs."""

    model_id: str
    problems: tuple[str, ...] = ()
    outputs: dict[str, Any] | None = None
    skipped: str | None = None
    seconds: float = 0.0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return not self.problems


def _cpu_backend(spec: Any, policy: Any) -> Any:
    """The spec's backend under ``policy``, unloaded, forced onto the CPU (a check must not need, or hold, a GPU)."""
    from sie.workers.backends import backend_config_from_spec, create_backend

    return create_backend(dataclasses.replace(backend_config_from_spec(spec, policy), device="cpu"))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 600 else text[:597] + "..."


def load_check(spec: Any, policy: Any) -> LoadReport:
    """Load ``spec``'s artifact on the CPU, score ``exampleInput``, check the output against ``outputSchema``.

    ``policy``: the ``sie.schemas.spec_policy.SpecPolicy`` a worker of this node would load it under
    (``SpecPolicy.from_settings``; the CLI adds the spec file's folder as a model root, as its checks do).
    """
    from sie.schemas.validation import compile_output_check, compile_validator

    started = time.monotonic()
    model_id = spec.model_id
    how = _loadable_sglang(spec) if spec.backend.type == "sglang" else None
    if spec.backend.type in NOT_LOADABLE and how is None:
        return LoadReport(model_id, skipped=NOT_LOADABLE[spec.backend.type])
    problems: list[str] = []
    example = spec.example_input
    notes: list[str] = []
    if example is None:
        notes.append("no exampleInput: the load was checked with a neutral row (0 / 0.0 / false / \"\")")
    else:
        try:
            example = compile_validator(spec.input_schema)(dict(example))
        except ValueError as exc:
            problems.append(f"spec.exampleInput: {exc}")
    if how == "window":
        return _window_check(spec, example, problems, notes, started)
    backend = _cpu_backend(spec, policy)
    outputs: dict[str, Any] | None = None
    try:
        try:
            backend.load()  # torch: refuses a non-archive artifact and an output shape that misfits the schema
        except Exception as exc:  # BackendError names the artifact and the fix; anything else is the model's
            problems.append(f"load: {_one_line(exc)}")
            return LoadReport(model_id, tuple(problems), None, None, time.monotonic() - started, tuple(notes))
        if problems:
            return LoadReport(model_id, tuple(problems), None, None, time.monotonic() - started, tuple(notes))
        row = dict(example) if example is not None else backend.config.warmup_input()
        try:
            result = backend.infer([row])
        except Exception as exc:
            problems.append(f"spec.exampleInput: inference failed: {_one_line(exc)}")
        else:
            if type(result) is not list or len(result) != 1:
                problems.append(f"backend: returned {type(result).__name__} of "
                                f"{len(result) if hasattr(result, '__len__') else '?'} outputs for 1 input")
            else:
                check = compile_output_check(spec.output_schema)
                outputs = result[0]
                try:
                    outputs = check(outputs) if check is not None else outputs
                except ValueError as exc:  # SchemaViolation: outputs.<field>: out of range [0, 1] (got -0.165)
                    problems.append(f"spec.outputSchema: exampleInput -> {exc}; at run time each such result is "
                                    f"a dead letter output_violation: fix the model (e.g. a missing sigmoid) or "
                                    f"the schema")
                try:
                    orjson.dumps(outputs, option=orjson.OPT_SERIALIZE_NUMPY)
                except TypeError as exc:
                    problems.append(f"outputs: not JSON-serialisable ({exc})")
    finally:
        close = getattr(backend, "close", None)
        if close is not None:
            close()
    return LoadReport(model_id, tuple(problems), outputs, None, time.monotonic() - started, tuple(notes))


def _window_check(spec: Any, example: Any, problems: list[str], notes: list[str], started: float) -> LoadReport:
    """An LLM spec served by running servers: the example (or a neutral row) as one real request through the
    window's own path and configured protocol (``sie.streams.llm.probe``)."""
    from sie.streams.llm.probe import probe
    from sie.workers.backends import backend_config_from_spec

    model_id = spec.model_id
    if problems:
        return LoadReport(model_id, tuple(problems), None, None, time.monotonic() - started, tuple(notes))
    row = dict(example) if example is not None else backend_config_from_spec(spec).warmup_input()
    got = probe(spec, row)
    if got.reason == "unreachable":
        problems.append(f"spec.backend.config.endpoints: {got.detail}")
    elif got.reason == "output_violation":
        problems.append(f"spec.outputSchema: exampleInput -> {got.detail}; at run time each such result is a dead "
                        f"letter output_violation")
    elif got.reason is not None:
        problems.append(f"spec.exampleInput: the server's answer would be a dead letter {got.reason}: {got.detail}")
    else:
        gen = got.generation
        notes.append(f"one request answered by {got.endpoint} in {got.seconds * 1000:.0f} ms"
                     + (f" ({gen.prompt_tokens} prompt + {gen.completion_tokens} completion tokens)" if gen else ""))
    return LoadReport(model_id, tuple(problems), got.outputs, None, time.monotonic() - started, tuple(notes))


def predict_window(spec: Any, value: bytes, settings: Any) -> Prediction:
    """``predict`` for an LLM spec served by running servers: the request through the window's path
    (``sie.streams.llm.probe``), the result built as the window builds it (``usage``, ``timings``)."""
    from sie.schemas.validation import compile_validator
    from sie.streams.llm.probe import probe
    from sie.streams.scorer.codec import Codec, Poison

    codec = Codec(spec.name, compile_validator(spec.input_schema), settings.max_request_bytes, 64)
    parsed = codec.parse("predict", 0, 0, None, _as_request(value), None)
    if isinstance(parsed, Poison):
        return Prediction(None, parsed.reason.value, parsed.detail)
    got = probe(spec, parsed.inputs)
    inference_ms = got.seconds * 1000.0
    if got.reason is not None or got.outputs is None:
        return Prediction(None, got.reason, got.detail, inference_ms)
    doc = orjson.loads(codec.result(parsed, spec.version, got.outputs, 0.0, inference_ms, got.batch))
    if got.first_token_ms is not None:
        doc["timings"]["first_token_ms"] = round(got.first_token_ms, 3)
    gen = got.generation
    doc["usage"] = {"prompt_tokens": gen.prompt_tokens if gen else None,
                    "completion_tokens": gen.completion_tokens if gen else None}
    return Prediction(orjson.dumps(doc), inference_ms=inference_ms)


def _as_request(value: bytes) -> bytes:
    """Bare inputs (``{"question": ...}``, as ``sie produce`` accepts) as a request ``{"inputs": ...}``."""
    try:
        doc = orjson.loads(value)
    except orjson.JSONDecodeError:
        return value
    return orjson.dumps({"inputs": doc}) if isinstance(doc, dict) and "inputs" not in doc else value


def _code_modules(spec: Any) -> list[tuple[str, str]]:
    """(spec field, top-level module) of every piece of code the spec names."""
    out = []
    for what, ref in (("spec.backend.callable", spec.backend.callable),
                      ("spec.backend.moduleClass", spec.backend.module_class)):
        if ref:
            out.append((what, ref.partition(":")[0].split(".")[0]))
    return out


def admission_problems(spec: Any, policy: Any, allowed_modules: Collection[str] = ()) -> LoadReport:
    """``load_check`` for the control plane's admission path (``POST /v1/models``): the same report, but code
    the spec names is imported only if its top-level module is in ``allowed_modules``; otherwise the load is
    skipped with a note (never refused: the agent's readiness inference still checks it).  What is imported
    is loaded under ``policy`` (the control plane's ``SpecPolicy``), as ``load_check``.

    The API layer (``sie.control``) cannot import ``sie.workers`` (layers): ``sie control`` hands this
    function to it.  It loads on the machine that runs it, so relative artifacts must resolve there.
    """
    blocked = [(what, top) for what, top in _code_modules(spec) if top not in set(allowed_modules)]
    if blocked:
        names = ", ".join(f"{what} (module {top!r})" for what, top in blocked)
        return LoadReport(spec.model_id, skipped=f"not loaded at admission: {names} is not in the allow-list of "
                                                 f"importable modules")
    return load_check(spec, policy)


@dataclass(frozen=True)
class Prediction:
    """One synchronous inference: ``value`` is the result JSON the scorer would publish, or None with the
    dead letter's ``reason`` and ``detail``."""

    value: bytes | None
    reason: str | None = None
    detail: str | None = None
    inference_ms: float = 0.0


def load_for_predict(spec: Any, policy: Any, device: str | None = None) -> Any:
    """The spec's backend under ``policy`` (as ``load_check``), loaded (on ``device`` when given, else the
    spec's own ``backend.device``)."""
    from sie.workers.backends import backend_config_from_spec, create_backend

    config = backend_config_from_spec(spec, policy)
    if device:
        config = dataclasses.replace(config, device=device)
    if spec.backend.type == "sglang" and not config.config.get("log_path"):
        # a server it launches logs to a file, so a server that exits says why ("last log lines: ..."), not only
        # "exited with code 1"
        import tempfile

        log_path = tempfile.NamedTemporaryFile(prefix=f"sie-predict-{spec.name}-", suffix=".log", delete=False).name
        config = dataclasses.replace(config, config={**config.config, "log_path": log_path})
    backend = create_backend(config)
    backend.load()
    return backend


def predict(spec: Any, backend: Any, value: bytes, settings: Any) -> Prediction:
    """Score one request (``{"id", "inputs", ...}`` or bare inputs) exactly as the scorer would."""
    from sie.schemas.validation import compile_output_check, compile_validator
    from sie.streams.scorer.codec import Codec, Poison

    codec = Codec(spec.name, compile_validator(spec.input_schema), settings.max_request_bytes, 64)
    parsed = codec.parse("predict", 0, 0, None, _as_request(value), None)
    if isinstance(parsed, Poison):
        return Prediction(None, parsed.reason.value, parsed.detail)
    started = time.monotonic()
    try:
        out = backend.infer([parsed.inputs])
    except Exception as exc:
        return Prediction(None, "inference_error", f"{type(exc).__name__}: {_one_line(exc)}")
    inference_ms = (time.monotonic() - started) * 1000.0
    if type(out) is not list or len(out) != 1:
        return Prediction(None, "inference_error", f"backend returned {type(out).__name__} for 1 input")
    outputs = out[0]
    check = compile_output_check(spec.output_schema)
    if check is not None:
        try:
            outputs = check(outputs)
        except ValueError as exc:
            return Prediction(None, "output_violation", f"model {spec.name} {spec.version}: {exc}", inference_ms)
    try:
        result = codec.result(parsed, spec.version, outputs, 0.0, inference_ms, 1)
    except TypeError as exc:
        return Prediction(None, "inference_error", f"outputs: not JSON-serialisable ({exc})", inference_ms)
    return Prediction(result, inference_ms=inference_ms)
