"""The shape of ``spec.backend.config``, per backend type: every key a backend reads, its type and default.

Why a strict schema: an unknown key accepted and ignored turns a misplaced ``max_new_tokens`` (its place is
``sampling_params.max_new_tokens``) into 128-token answers, and a typo ``protocl`` into the SGLang protocol
against a vLLM server (404 on ``/generate``, every request held).  So::

    check_backend_config(type, config) -> [(path, reason)]      # empty: the config is good
        pydantic, extra="forbid", strict types, per backend type (TorchConfig, PythonConfig, SGLangConfig)
        an unknown key -> "unknown key; did you mean <the key it probably meant>?"
        a URL -> http(s), a host, a port in 1..65535 (checked where parsed: never a traceback later)

| problem | reported as |
|---|---|
| unknown key | its path, and the likely intended key: a nested key at the top level (``max_new_tokens`` -> ``sampling_params.max_new_tokens``, ``tokens_per_s`` -> ``quotas.tokens_per_s``) or the closest known key (``protocl`` -> ``protocol``) |
| a value of the wrong type or range | its path and pydantic's reason |
| a ``sampling_params`` key the protocol does not send | sglang: not a field of SGLang's ``SamplingParams``; OpenAI protocols: only ``max_new_tokens`` and ``temperature`` are sent, the rest belongs in ``extra_body`` |
| a URL without http(s), host, or with a port outside 1..65535 | its path and the URL (without credentials) |

The keys and their defaults are documented in docs/llm.md ("Backend config reference") and
docs/backends.md; ``tests/schemas/test_backend_config.py`` checks that the docs list every key with the
default declared here.  The runtime readers (``sie.streams.llm.config.LLMConfig``, ``quota.Quotas``,
the launcher, the batch backend) read the same keys with the same defaults.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

#: the fields of SGLang 0.5.23's ``SamplingParams`` (tests/fixtures/sglang_contract.json, checked by
#: tests/schemas/test_backend_config.py): what ``sampling_params`` may hold for the sglang protocol
SGLANG_SAMPLING_PARAMS = frozenset({
    "beam_width", "custom_params", "ebnf", "ebnf_full_assistant", "frequency_penalty", "ignore_eos", "is_normalized",
    "json_schema", "logit_bias", "max_new_tokens", "min_new_tokens", "min_p", "n", "no_stop_trim",
    "presence_penalty", "regex", "repetition_penalty", "sampling_seed", "skip_special_tokens",
    "spaces_between_special_tokens", "stop", "stop_regex", "stop_regex_max_len", "stop_regex_strs",
    "stop_str_max_len", "stop_strs", "stop_token_ids", "stream_interval", "structural_tag", "temperature", "top_k",
    "top_p", "watermark"})
#: what the OpenAI-compatible protocols take from ``sampling_params`` (as ``max_tokens`` and ``temperature``)
OPENAI_SAMPLING_PARAMS = frozenset({"max_new_tokens", "temperature"})


def url_problem(url: Any) -> str | None:
    """Why ``url`` cannot be an LLM server's address (None: it can): http(s), a host, a port in 1..65535.
    The message shows the URL without credentials, query or fragment (``safe_uri``)."""
    from sie.schemas.artifact_cache import safe_uri

    if not isinstance(url, str):
        return f"must be an http(s) URL of a server (got a {type(url).__name__})"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # "Port out of range 0-65535", "Port could not be cast to integer value ..."
        if "out of range" in str(exc):
            return "port out of range 1-65535"
        return f"not a URL ({str(exc)[:80]})"
    if parts.scheme not in ("http", "https"):
        return f"must be an http(s) URL of a server (got {safe_uri(url)!r})"
    if not parts.hostname:
        return f"must name a host (got {safe_uri(url)!r})"
    if port == 0:
        return "port out of range 1-65535"
    return None


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class EndpointConfig(_Strict):
    """One entry of ``endpoints`` given as a mapping."""

    url: str = Field(description="the server's base URL, http(s), host and port")
    concurrency: int | None = Field(None, ge=1, description="requests at once (default: max_concurrency)")
    weight: float = Field(1.0, ge=0, description="share of the keys (weighted rendezvous hashing)")
    reserve_p0: int | None = Field(None, ge=0, description="slots a P1/P2 model leaves free (default: reserve_p0)")

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        problem = url_problem(value)
        if problem:
            raise ValueError(problem)
        return value


class CallerLimits(_Strict):
    requests_per_s: float | None = Field(None, gt=0)
    tokens_per_s: float | None = Field(None, gt=0)
    token_sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$")


class QuotaConfig(_Strict):
    """``quotas`` (sie.streams.llm.quota)."""

    caller: str = "metadata.caller"
    requests_per_s: float | None = Field(None, gt=0)
    tokens_per_s: float | None = Field(None, gt=0)
    callers: dict[str, CallerLimits] = Field(default_factory=dict)
    unknown_callers: Literal["shared", "reject"] = "shared"
    policy: Literal["reject", "delay"] = "reject"
    max_delay_s: float = Field(10.0, gt=0)
    max_delayed: int | None = Field(None, gt=0)
    defer: bool = True
    defer_over: int | None = Field(None, gt=0)
    defer_after_s: float = Field(1.0, gt=0)
    deferred_window: int | None = Field(None, gt=0)


class DirectorConfig(_Strict):
    """``director`` as a mapping (sie.control.reconcile.director.DirectorPolicy); unset: the defaults,
    with the queue thresholds derived from the endpoints' slots (docs/llm.md)."""

    hot_utilisation_pct: float | None = None
    hot_queue: float | None = None
    shift_fraction: float | None = None
    cool_utilisation_pct: float | None = None
    cool_queue: float | None = None
    sustain_s: float | None = None
    hold_s: float | None = None
    restore_after_s: float | None = None
    min_weight: float | None = None


class TorchConfig(_Strict):
    threads: int = Field(1, ge=0, description="torch's intra-op threads")


class PythonConfig(_Strict):
    """The python backend reads no config key."""


class SGLangConfig(_Strict):
    """An sglang backend: the launcher, the batch backend and the LLM window (docs/llm.md)."""

    # --- which server, which protocol
    protocol: Literal["sglang", "openai-completions", "openai-chat"] = "sglang"
    endpoints: list[str | EndpointConfig] | None = None
    server_url: str | None = None
    served_model_name: str | None = None
    model: str | None = None
    # --- the request
    prompt_template: str | None = None
    output_mode: Literal["json", "text"] | None = None
    sampling_params: dict[str, Any] = Field(default_factory=dict)
    output_ranges: dict[str, tuple[float, float]] = Field(default_factory=dict)
    extra_body: dict[str, Any] = Field(default_factory=dict)
    stream: bool = False
    # --- the window
    max_concurrency: int = Field(16, ge=1)
    reserve_p0: int = Field(0, ge=0)
    request_timeout_s: float = Field(120.0, ge=0.001)
    connect_timeout_s: float = Field(5.0, ge=0.001)
    commit_interval_ms: float = Field(100.0, ge=1)
    max_pending: int = Field(0, ge=0)
    endpoint_backoff_s: float = Field(0.5, ge=0.001)
    endpoint_backoff_max_s: float = Field(30.0, ge=0.001)
    poison_after: int = Field(3, ge=1)
    director: bool | DirectorConfig | None = None
    director_interval_ms: float = Field(1000.0, ge=10)
    quotas: QuotaConfig | None = None
    # --- a server the replica launches (sie.workers.sglang_launcher) and the batch backend
    tp_size: int | None = Field(None, ge=1)
    #: accepted (the article's spec sets them) but not passed to the server: a warning says so (IGNORED)
    dp_size: int | None = Field(None, ge=1)
    enable_flashinfer: bool | None = None
    max_seq_len: int | None = Field(None, ge=1)
    mem_fraction_static: float | None = Field(None, gt=0, le=1)
    extra_args: list[str] = Field(default_factory=list)
    server_entry: list[str] | None = None
    device_override: str | None = None
    startup_timeout_s: float = Field(600.0, gt=0)
    health_poll_interval_s: float = Field(0.5, gt=0)
    shutdown_timeout_s: float = Field(30.0, gt=0)

    @field_validator("endpoints")
    @classmethod
    def _endpoint_urls(cls, value: list[str | EndpointConfig] | None) -> list[str | EndpointConfig] | None:
        for i, item in enumerate(value or ()):
            if isinstance(item, str):
                problem = url_problem(item)
                if problem:
                    raise _Misplaced((f"endpoints[{i}]",), problem)
        return value

    @field_validator("server_url")
    @classmethod
    def _server_url(cls, value: str | None) -> str | None:
        problem = None if value is None else url_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _sampling(self) -> SGLangConfig:
        allowed = SGLANG_SAMPLING_PARAMS if self.protocol == "sglang" else OPENAI_SAMPLING_PARAMS
        for key in self.sampling_params:
            if key not in allowed:
                if self.protocol == "sglang":
                    raise _Misplaced(("sampling_params", key), "not a field of SGLang's SamplingParams"
                                     + _suggest(key, sorted(SGLANG_SAMPLING_PARAMS)))
                raise _Misplaced(("sampling_params", key),
                                 f"protocol {self.protocol} sends only max_new_tokens (as max_tokens) and temperature "
                                 f"from sampling_params; put {key} in extra_body")
        return self


class _Misplaced(ValueError):
    def __init__(self, loc: tuple[str, ...], reason: str) -> None:
        super().__init__(reason)
        self.loc, self.reason = loc, reason


#: keys SIE accepts but does not act on: each is a spec warning naming what to do instead
IGNORED = {
    "dp_size": "not passed to the server: SIE launches one SGLang server per replica and sets no data parallelism; "
               "pass --dp-size in extra_args if the node allows it (SIE_SGLANG_EXTRA_ARGS)",
    "enable_flashinfer": "not passed to the server (SGLang picks its attention backend); pass --attention-backend in "
                         "extra_args if the node allows it (SIE_SGLANG_EXTRA_ARGS)",
}

MODELS: dict[str, type[_Strict]] = {"torch": TorchConfig, "python": PythonConfig, "sglang": SGLangConfig}
_MODEL_NAMES = frozenset({"EndpointConfig", "CallerLimits", "QuotaConfig", "DirectorConfig"})

#: keys that belong one level down, by where a user puts them by mistake (the top level)
_MOVED = {
    "max_tokens": "sampling_params.max_new_tokens",
    "url": "endpoints[].url", "concurrency": "max_concurrency (or endpoints[].concurrency)",
    "weight": "endpoints[].weight",
}


def _suggest(key: str, known: list[str]) -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _likely(model: type[BaseModel], loc: tuple[Any, ...]) -> str:
    """The key an unknown key at ``loc`` probably meant (``; did you mean X?``), or the known keys."""
    key = str(loc[-1])
    parent: Any = model
    for part in loc[:-1]:  # walk to the model that holds the unknown key
        if isinstance(part, int) or parent is None:
            continue
        field = parent.model_fields.get(str(part)) if hasattr(parent, "model_fields") else None
        parent = _model_of(field.annotation) if field is not None else None
    known = sorted(parent.model_fields) if parent is not None and hasattr(parent, "model_fields") else []
    if parent is SGLangConfig:
        if key in _MOVED:
            return f"; did you mean {_MOVED[key]}?"
        if key in SGLANG_SAMPLING_PARAMS:
            return f"; did you mean sampling_params.{key}?"
        if key in QuotaConfig.model_fields:
            return f"; did you mean quotas.{key}?"
    hint = _suggest(key, known)
    return hint or (f" (known: {', '.join(known)})" if known else "")


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``annotation`` (``X | None``, ``list[str | X]``, ``dict[str, X]``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _model_of(arg)
        if found is not None:
            return found
    return None


def _is_tag(part: str) -> bool:
    """A union arm's tag in an error's location (``str``, ``bool``, ``EndpointConfig``, ``list[...]``), not a key."""
    return part in ("str", "bool", "int", "float") or part in _MODEL_NAMES or part.startswith(
        ("function-", "list[", "dict[", "tuple["))


def _arm(reason: str) -> bool:
    """A union arm's "wrong type" line (another arm may fit, or has its own, more precise problem)."""
    return reason.startswith("Input should be a valid ")


def check_backend_config(btype: str, config: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every problem of ``config`` for backend ``btype``, as (path below ``config``, reason); empty: good."""
    model = MODELS.get(btype)
    if model is None:
        return []
    try:
        model.model_validate(dict(config))
    except _Misplaced as exc:
        return [(".".join(exc.loc), exc.reason)]
    except ValidationError as exc:
        out: list[tuple[str, str]] = []
        for err in exc.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and _is_tag(p)))
            path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
            ctx_error = (err.get("ctx") or {}).get("error")
            if isinstance(ctx_error, _Misplaced):
                out.append((".".join(ctx_error.loc), ctx_error.reason))
                continue
            elif err["type"] == "extra_forbidden":
                out.append((path, "unknown key" + _likely(model, loc)))
            else:
                msg = str(err["msg"]).removeprefix("Value error, ")
                out.append((path, msg))
        # a union (str | EndpointConfig) reports each arm: keep one line per path, the mapping arm's, and no
        # "not a string" line for an entry whose mapping has a problem of its own
        seen: dict[str, str] = {}
        for path, reason in out:
            if path not in seen or _arm(seen[path]):
                seen[path] = reason
        return [(path, reason) for path, reason in seen.items()
                if not (_arm(reason) and any(p.startswith(path + ".") for p in seen))]
    return []
