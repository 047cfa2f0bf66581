"""LLMConfig: the window's knobs, read once from ``spec.backend.config`` (plus the scorer's Kafka config).

The keys, their types and defaults are declared once in ``sie.schemas.backend_config`` (``SGLangConfig``,
checked at apply) and listed for users in docs/llm.md, "Backend config reference"; this module turns a checked
config into the window's settings: endpoints (``endpoints`` or ``server_url``, each with its concurrency,
weight and ``reserve_p0``), timeouts, the commit cadence, ``max_pending``, endpoint ejection backoff,
``poison_after``, the traffic director's policy; prompts and outputs are ``protocols.py``'s, quotas
``quota.py``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sie.kernel.errors import ConfigError
from sie.schemas.backend_config import url_problem
from sie.streams.llm.pool import Endpoint
from sie.streams.llm.protocols import PROTOCOLS


def _num(cfg: Mapping[str, Any], name: str, default: float, low: float) -> float:
    value = cfg.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < low:
        raise ConfigError(f"spec.backend.config.{name}: must be a number >= {low:g} (got {value!r})")
    return float(value)


def _flag(cfg: Mapping[str, Any], name: str) -> bool:
    value = cfg.get(name, False)
    if not isinstance(value, bool):
        raise ConfigError(f"spec.backend.config.{name}: must be true or false (got {value!r})")
    return value


@dataclass(frozen=True)
class LLMConfig:
    endpoints: tuple[tuple[str, int, float, int], ...]  # (url, concurrency, weight, reserved for P0)
    protocol: str = "sglang"
    request_timeout_s: float = 120.0
    connect_timeout_s: float = 5.0
    commit_interval_s: float = 0.1
    max_pending: int = 0  # 0: sixteen times the pool's capacity (pending_limit)
    backoff_s: float = 0.5
    backoff_max_s: float = 30.0
    poison_after: int = 3
    stream: bool = False
    #: the traffic director's policy over the endpoints' weights (None: off)
    director: Any = None
    director_interval_s: float = 1.0

    @property
    def capacity(self) -> int:
        return sum(e[1] for e in self.endpoints)

    @property
    def pending_limit(self) -> int:
        """Records consumed and not committed.  Not C: a finished record waits in the window until every
        earlier record of its partition is finished (the commit rule), so with a heavy-tailed generation
        time most of the window is finished records behind a slow head.  By Little's law the window must
        hold throughput x residence, and residence is about the tail of the generation time, not its
        mean (16 x C kept the server at its bound in bench_llm: docs/llm.md)."""
        return self.max_pending or 16 * self.capacity

    def pool_endpoints(self) -> list[Endpoint]:
        return [Endpoint(url, concurrency, weight, reserved=reserved)
                for url, concurrency, weight, reserved in self.endpoints]

    @classmethod
    def from_backend_config(cls, cfg: Mapping[str, Any]) -> LLMConfig:
        per = int(_num(cfg, "max_concurrency", 16, 1))
        reserve = int(_num(cfg, "reserve_p0", 0, 0))
        raw = cfg.get("endpoints") or ([cfg["server_url"]] if cfg.get("server_url") else [])
        if not isinstance(raw, list) or not raw:
            raise ConfigError("spec.backend.config.endpoints: list the servers' URLs (or set server_url) to "
                              "use the LLM window")
        endpoints = []
        for i, item in enumerate(raw):
            spec = item if isinstance(item, Mapping) else {"url": item}
            url = spec.get("url")
            problem = url_problem(url)  # the parser checked the spec's; a launched server's URL is ours
            if problem or not isinstance(url, str):
                raise ConfigError(f"spec.backend.config.endpoints[{i}].url: {problem}")
            concurrency = int(_num(spec, "concurrency", per, 1))
            reserved = int(_num(spec, "reserve_p0", reserve, 0))
            if reserved >= concurrency:
                raise ConfigError(f"spec.backend.config.endpoints[{i}].reserve_p0: must be below its concurrency "
                                  f"{concurrency} (got {reserved})")
            endpoints.append((url.rstrip("/"), concurrency, _num(spec, "weight", 1.0, 0), reserved))
        protocol = str(cfg.get("protocol") or "sglang")
        if protocol not in PROTOCOLS:
            raise ConfigError(f"spec.backend.config.protocol: must be one of {', '.join(PROTOCOLS)} (got {protocol!r})")
        return cls(tuple(endpoints), protocol,
                   request_timeout_s=_num(cfg, "request_timeout_s", 120.0, 0.001),
                   connect_timeout_s=_num(cfg, "connect_timeout_s", 5.0, 0.001),
                   commit_interval_s=_num(cfg, "commit_interval_ms", 100, 1) / 1000.0,
                   max_pending=int(_num(cfg, "max_pending", 0, 0)),
                   backoff_s=_num(cfg, "endpoint_backoff_s", 0.5, 0.001),
                   backoff_max_s=_num(cfg, "endpoint_backoff_max_s", 30.0, 0.001),
                   poison_after=int(_num(cfg, "poison_after", 3, 1)),
                   stream=_flag(cfg, "stream"),
                   director=_director(cfg.get("director"), [e[1] for e in endpoints]),
                   director_interval_s=_num(cfg, "director_interval_ms", 1000, 10) / 1000.0)


def _director(doc: Any, slots: list[int]) -> Any:
    """The director's policy: ``false`` -> off; absent -> the default rule when there is more than one endpoint
    (with one, there is nowhere to shift to); a mapping -> its numbers.

    The queue thresholds not given are derived from the endpoints' slots: an endpoint's "queue" is its
    requests in flight, which never exceed its slots, so the rollout director's defaults (hot above 50, cool
    below 10) could never fire at 8 slots.  ``hot_queue`` = ``hot_utilisation_pct`` % of the smallest
    endpoint's slots and ``cool_queue`` = ``cool_utilisation_pct`` % of the largest's (at most ``hot_queue``):
    with equal endpoints both say what the utilisation says, so utilisation decides."""
    from sie.control.reconcile.director import DirectorPolicy

    if doc is False or (doc is None and len(slots) < 2):
        return None
    if doc is None or doc is True:
        doc = {}
    if not isinstance(doc, Mapping):
        raise ConfigError(f"spec.backend.config.director: a mapping of numbers, true or false (got {doc!r})")
    from sie.control.reconcile.autoscaler import policy_numbers

    try:
        numbers = policy_numbers(DirectorPolicy, doc, "director")  # unknown keys, non-numbers: errors
        hot_pct = numbers.get("hot_utilisation_pct", DirectorPolicy.hot_utilisation_pct)
        cool_pct = numbers.get("cool_utilisation_pct", DirectorPolicy.cool_utilisation_pct)
        numbers.setdefault("hot_queue", hot_pct / 100.0 * min(slots))
        numbers.setdefault("cool_queue", min(cool_pct / 100.0 * max(slots), numbers["hot_queue"]))
        return DirectorPolicy(**numbers)
    except ConfigError as exc:
        raise ConfigError(f"spec.backend.config.{exc}") from None


def uses_window(spec: Any) -> bool:
    """True when ``spec`` is served through the LLM window: an sglang backend whose config names servers."""
    backend = getattr(spec, "backend", None)
    cfg = getattr(backend, "config", None) or {}
    return getattr(backend, "type", None) == "sglang" and bool(cfg.get("endpoints") or cfg.get("server_url"))


def serves_through_window(spec: Any, launched_server: bool = False) -> bool:
    """THE rule for which specs are served through the LLM window (``sie score`` and the agent's worker ask it).

    Every sglang spec, once something answers for it: the servers its config names (``uses_window``), or the
    SGLang server a replica launched itself (``launched_server``: the agent's worker starts one per replica,
    ``sie.workers.sglang_launcher``).  Any other backend goes through the batch scorer."""
    backend = getattr(spec, "backend", None)
    return getattr(backend, "type", None) == "sglang" and (launched_server or uses_window(spec))


def launched_concurrency(cfg: Mapping[str, Any]) -> int:
    """The window's C for a server the replica launched: the ``--max-running-requests`` it was started with
    (``spec.backend.config.extra_args``: the most the server runs at once, so a larger C only queues in the
    server and a smaller one leaves slots idle), else ``max_concurrency`` (default 16)."""
    args = [str(a) for a in cfg.get("extra_args") or ()]
    for i, arg in enumerate(args):
        value = arg.split("=", 1)[1] if arg.startswith("--max-running-requests=") else (
            args[i + 1] if arg == "--max-running-requests" and i + 1 < len(args) else None)
        if value is not None:
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"spec.backend.config.extra_args: --max-running-requests must be a whole "
                                  f"number >= 1 (got {value!r})")
            return int(value)
    return int(_num(cfg, "max_concurrency", 16, 1))


def with_launched_server(cfg: Mapping[str, Any], url: str, model_name: str | None = None) -> dict[str, Any]:
    """``cfg`` with the replica's own server first among the endpoints, at ``launched_concurrency`` slots; the
    endpoints the spec names (``endpoints`` / ``server_url``) follow it.  ``model_name``: the name the launcher
    serves the model under when the spec sets no ``served_model_name`` (``--served-model-name``, the spec's
    name): the OpenAI-compatible protocols send it as ``model``, and a real server refuses any other (vLLM:
    404 "The model ... does not exist")."""
    named = cfg.get("endpoints") or ([cfg["server_url"]] if cfg.get("server_url") else [])
    if not isinstance(named, list):
        raise ConfigError(f"spec.backend.config.endpoints: must be a list of URLs or mappings (got {named!r})")
    own = {"url": url, "concurrency": launched_concurrency(cfg)}
    out = {k: v for k, v in cfg.items() if k != "server_url"} | {"endpoints": [own, *named]}
    if model_name and not cfg.get("served_model_name"):
        out["served_model_name"] = model_name
    return out


def deferred_topic(spec: Any, names: Any, launched_server: bool = False) -> str | None:
    """The model's deferred topic when ``spec`` is served through the window with quota policy ``delay``
    (``sie.streams.llm.defer``; whoever creates the model's topics creates it too), else None."""
    if not serves_through_window(spec, launched_server):
        return None
    quotas = (getattr(spec.backend, "config", None) or {}).get("quotas")
    if not isinstance(quotas, Mapping) or quotas.get("policy") != "delay" or quotas.get("defer", True) is False:
        return None
    return str(names.llm_deferred_topic(spec.name))
