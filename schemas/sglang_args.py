"""What a spec's ``extra_args`` may tell an SGLang server: resolved with SGLang's own argument table, allowed by
destination.

WHY not a list of forbidden flags: ``sglang serve`` parses its command line with a plain ``argparse`` parser
(``allow_abbrev`` on), so ``--trust-remote`` and ``--trust-remote-cod`` ARE ``--trust-remote-code``; ``--model``
is an alias of ``--model-path``; a repeated ``--host`` wins over SIE's; and ``--config FILE`` reads more options
from a file.  No list of spellings can be complete.  So every argument is resolved the way SGLang resolves it,
to the DESTINATION it sets (``trust_remote_code``), and the destination is compared with an allow-list::

    table   = SGLang's parser, pinned (schemas/json/sglang_server_args.json, made by scripts/sglang_contract.py
              from the real parser: option strings, destination, nargs, type, choices, allow_abbrev)
    for each token that argparse would take for an option:
        spelled exactly as one of the table's option strings, else refused (an abbreviation may name another
        flag in the SGLang version a node runs; the refusal names the flag it stands for here)
    namespace = an argparse parser built from the table parses extra_args   (parse errors are refusals)
    each destination set: not one SIE sets itself (FIXED), and in the allow-list (ALLOWED_DESTS plus the
        node's SIE_SGLANG_EXTRA_ARGS, plus trust_remote_code where SIE_SGLANG_TRUST_REMOTE_CODE allows it)

``check_launch`` repeats the proof on the command line a worker is about to run (``sglang_launcher``): parsed by
the table, ``extra_args`` set no destination SIE sets, and every destination of SIE's own arguments keeps SIE's value.

Failures (each a ``field: reason`` line naming the argument and the fix):

=====================================  ==========================================================================
``--trust-remote``                     abbreviates --trust-remote-code (trust_remote_code): spell options in full
``--model /etc``, ``--host 0.0.0.0``   SIE sets model_path/host itself: the spec field that sets it, if any
``--enable-custom-logit-processor``    not allowed on this node (SIE_SGLANG_EXTRA_ARGS lists what a node adds)
``--config f.yaml``, ``--help``        not allowed (a file of more options; prints and exits)
``--no-such-flag``                     not an option of SGLang <version>
``--max-running-requests x``           argparse's own message (invalid int value)
``--``                                 ends SGLang's options: refused
=====================================  ==========================================================================
"""

from __future__ import annotations

import argparse
import importlib.resources
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cache, cached_property
from typing import Any

from sie.kernel.errors import ConfigError

FIELD = "spec.backend.config.extra_args"

#: destinations SIE's launcher sets (``sie.workers.sglang_launcher.build_launch``) -> the spec field that sets each
FIXED: Mapping[str, str] = {
    "model_path": "name the model in spec.backend.modelPath",
    "host": "the server listens on loopback only",
    "port": "the worker picks a free port",
    "tp_size": "set spec.backend.config.tp_size",
    "served_model_name": "set spec.backend.config.served_model_name",
    "enable_metrics": "always on",
    "base_gpu_id": "the replica's reserved GPUs",
    "mem_fraction_static": "set spec.resources.gpuMemoryMb (spec.backend.config.mem_fraction_static without NVML)",
    "device": "set spec.backend.config.device_override",
}

#: ``backend.config`` keys from which SIE passes an option that is otherwise the spec's to set
CONFIG_SETS: Mapping[str, str] = {"max_seq_len": "context_length"}

#: what a spec may tune on any node: scheduling, batching, numerics and kernel choices.  Nothing here names a
#: file, a host, a port, a secret or code; nothing takes GPUs or host memory beyond the replica's reservation.
ALLOWED_DESTS = frozenset({
    "tokenizer_mode", "dtype", "quantization", "kv_cache_dtype",
    "context_length",  # unless spec.backend.config.max_seq_len sets it (then SIE passes it: check_launch)
    "max_running_requests", "max_queued_requests", "max_total_tokens", "chunked_prefill_size",
    "max_prefill_tokens", "prefill_max_requests", "schedule_policy", "schedule_conservativeness",
    "enable_priority_scheduling", "default_priority_value", "page_size", "disable_radix_cache",
    "disable_overlap_schedule", "num_continuous_decode_steps", "enable_mixed_chunk", "random_seed",
    "stream_interval", "log_level", "log_level_http", "attention_backend", "decode_attention_backend",
    "prefill_attention_backend", "sampling_backend", "grammar_backend", "cuda_graph_max_bs_decode",
    "cuda_graph_max_bs_prefill", "disable_cuda_graph", "disable_prefill_cuda_graph", "disable_decode_cuda_graph",
    "disable_cuda_graph_padding", "enable_torch_compile", "torch_compile_max_bs", "disable_custom_all_reduce",
    "reasoning_parser", "tool_call_parser", "allow_auto_truncate", "skip_server_warmup",
    "enable_deterministic_inference", "watchdog_timeout", "constrained_json_disable_any_whitespace",
    "enable_cache_report",
})
#: the destination ``SIE_SGLANG_TRUST_REMOTE_CODE`` adds
TRUST_REMOTE_CODE = "trust_remote_code"
_NEGATIVE_NUMBER = re.compile(r"^-\d+$|^-\d*\.\d+$")  # argparse's: a value, never an option


def human_readable_int(value: str) -> int:
    """SGLang's own ``human_readable_int`` (``sglang.srt.utils.common``, 0.5.23): ``4096``, ``32k``, ``1.5M``, ``4Ki``."""
    text = value.strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|k|M|G|T)", text)
    if match:
        number, suffix = match.groups()
        if suffix.endswith("i"):
            if "." in number:
                raise argparse.ArgumentTypeError(f"Decimals are not allowed with IEC suffixes like '{suffix}'")
            return int(number) * 2 ** (10 * ("KMGT".index(suffix[0]) + 1))
        return int(Decimal(number) * 10 ** (3 * ("kMGT".index(suffix) + 1)))
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"Invalid integer value: '{text}'. Use a plain integer, SI suffixes (1k, 1M), "
                                         "or IEC suffixes (1Ki, 1Mi).") from None


#: the argument types of the table this parser reproduces; any other (custom parsers) is taken as a string
_TYPES: Mapping[str, Any] = {"int": int, "float": float, "human_readable_int": human_readable_int}


class ArgsRefused(ValueError):
    """``extra_args`` (or a launch command) that SGLang would parse into something this node does not allow."""


@dataclass(frozen=True)
class Action:
    options: tuple[str, ...]
    dest: str
    nargs: int | str | None
    type: str | None = None
    choices: tuple[Any, ...] | None = None


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # never print and exit: a refusal with argparse's reason
        raise ArgsRefused(message)


@dataclass(frozen=True)
class ArgTable:
    """SGLang's argument table (one pinned version) and a parser that resolves arguments exactly as SGLang's does."""

    version: str
    allow_abbrev: bool
    prefix_chars: str
    actions: tuple[Action, ...]

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> ArgTable:
        if doc.get("fromfile_prefix_chars"):  # '@file' arguments: a parser reading files is not one we model
            raise ValueError("sglang_server_args.json: fromfile_prefix_chars is set; re-check the resolver")
        actions = tuple(Action(tuple(a["options"]), a["dest"], a["nargs"], a.get("type"),
                               tuple(a["choices"]) if a.get("choices") is not None else None)
                        for a in doc["actions"])
        return cls(str(doc["sglang_version"]), bool(doc["allow_abbrev"]), str(doc["prefix_chars"]), actions)

    @cached_property
    def dest_of(self) -> dict[str, str]:
        """Option string -> destination."""
        return {option: a.dest for a in self.actions for option in a.options}

    @property
    def dests(self) -> frozenset[str]:
        return frozenset(a.dest for a in self.actions)

    def options_of(self, dest: str) -> tuple[str, ...]:
        return tuple(o for a in self.actions if a.dest == dest for o in a.options)

    @cached_property
    def _parser(self) -> argparse.ArgumentParser:
        return self.parser()

    def parser(self) -> argparse.ArgumentParser:
        """An argparse parser with SGLang's option strings, destinations, arities and abbreviation rule; every
        default suppressed, so the namespace holds exactly the destinations the arguments set."""
        parser = _Parser(prog="sglang serve", add_help=False, allow_abbrev=self.allow_abbrev,
                         prefix_chars=self.prefix_chars, argument_default=argparse.SUPPRESS)
        for a in self.actions:
            if a.nargs == 0:
                parser.add_argument(*a.options, dest=a.dest, action="store_const", const=True)
                continue
            kwargs: dict[str, Any] = {"dest": a.dest, "nargs": a.nargs, "type": _TYPES.get(a.type or "", str)}
            if a.choices is not None and a.type in (None, "str", "int", "float"):
                kwargs["choices"] = a.choices
            parser.add_argument(*a.options, **kwargs)
        return parser

    def is_option_token(self, token: str) -> bool:
        """Whether argparse takes ``token`` for an option (not a value): it starts with a prefix character, is
        longer than one character and is not a negative number (SGLang has no option that looks like one)."""
        return len(token) > 1 and token[0] in self.prefix_chars and not _NEGATIVE_NUMBER.fullmatch(token)

    def spelled(self, token: str) -> str:
        """The option string ``token`` names exactly (``--x`` or ``--x=value``), else ``ArgsRefused`` saying what
        SGLang's abbreviation rule would make of it."""
        known = self.dest_of
        name = token.split("=", 1)[0] if "=" in token else token
        if token in known:
            return token
        if name in known:
            return name
        if token == "--" or name == "--":
            raise ArgsRefused(f"{token!r} ends SGLang's options; leave it out")
        matches = sorted({o for o in known if o.startswith(name) and len(name) > 1})
        if len(matches) == 1:
            raise ArgsRefused(f"{name!r} abbreviates {matches[0]} ({known[matches[0]]}); spell options in full "
                              "(an abbreviation may name another option in the SGLang version a node runs)")
        if matches:
            raise ArgsRefused(f"{name!r} is ambiguous in SGLang {self.version} ({', '.join(matches[:4])}"
                              f"{', ...' if len(matches) > 4 else ''}); spell the option in full")
        raise ArgsRefused(f"{name!r} is not an option of SGLang {self.version}")

    def resolve(self, argv: Sequence[str]) -> dict[str, Any]:
        """The destinations ``argv`` sets and their values, as SGLang's parser resolves them (``ArgsRefused``
        for an abbreviated or unknown option, or anything SGLang's parser itself would reject)."""
        for token in argv:
            if self.is_option_token(token):
                self.spelled(token)
        return vars(self._parser.parse_args(list(argv)))


@cache
def sglang_table() -> ArgTable:
    """The pinned table of the SGLang version SIE is tested against (package data)."""
    text = importlib.resources.files("sie.schemas").joinpath("json/sglang_server_args.json").read_text("utf-8")
    return ArgTable.from_document(json.loads(text))


def allowed_dests(extra: Iterable[str] = (), trust_remote_code: bool = False) -> frozenset[str]:
    """The destinations a spec may set on a node: ``ALLOWED_DESTS``, the node's additions, trust_remote_code if
    allowed.  The destinations SIE sets itself are never allowed, whatever a node says."""
    return (ALLOWED_DESTS | set(extra) | ({TRUST_REMOTE_CODE} if trust_remote_code else set())) - set(FIXED)


def node_dests(values: Iterable[str], table: ArgTable | None = None) -> tuple[str, ...]:
    """``SIE_SGLANG_EXTRA_ARGS`` entries (an option string ``--chat-template`` or a destination ``chat_template``)
    as destinations; ``ConfigError`` for one SGLang does not have or one SIE sets itself."""
    table = table or sglang_table()
    out = []
    for value in values:
        dest = table.dest_of.get(value) or (value if value in table.dests else None)
        if dest is None:
            raise ConfigError(f"SIE_SGLANG_EXTRA_ARGS: {value!r} is not an option of SGLang {table.version}")
        if dest in FIXED:
            raise ConfigError(f"SIE_SGLANG_EXTRA_ARGS: {value!r} ({dest}) is set by SIE itself and cannot be allowed")
        out.append(dest)
    return tuple(out)


def check_extra_args(extra: Any, allowed: frozenset[str], table: ArgTable | None = None,
                     config: Mapping[str, Any] | None = None) -> list[str]:
    """Every problem of a spec's ``extra_args`` under ``allowed``, one ``field: reason`` line each (``config``: the
    spec's ``backend.config``, whose keys make SIE pass some options itself, e.g. ``max_seq_len``)."""
    if extra is None:
        return []
    if not isinstance(extra, list) or not all(isinstance(a, str) for a in extra):
        return [f"{FIELD}: must be a list of strings (got {_short(extra)})"]
    table = table or sglang_table()
    problems = []
    for token in extra:
        if table.is_option_token(token):
            try:
                table.spelled(token)
            except ArgsRefused as exc:
                problems.append(f"{FIELD}: {exc}")
    if problems:
        return problems
    try:
        resolved = table.resolve(extra)
    except ArgsRefused as exc:
        return [f"{FIELD}: SGLang {table.version} would refuse these arguments: {exc}"]
    set_by_config = {dest: f"spec.backend.config.{key}" for key, dest in CONFIG_SETS.items()
                     if (config or {}).get(key) is not None}
    written: dict[str, str] = {}
    for token in extra:
        if table.is_option_token(token):
            written.setdefault(table.dest_of[table.spelled(token)], table.spelled(token))
    for dest in resolved:
        flag = written.get(dest) or table.options_of(dest)[0]
        if dest in FIXED:
            problems.append(f"{FIELD}: {flag} ({dest}) is set by SIE itself: {FIXED[dest]}")
        elif dest in set_by_config:
            problems.append(f"{FIELD}: {flag} ({dest}) is set by SIE from {set_by_config[dest]}; set one of them")
        elif dest == TRUST_REMOTE_CODE and dest not in allowed:
            problems.append(f"{FIELD}: {flag} runs Python shipped with the model; set "
                            "SIE_SGLANG_TRUST_REMOTE_CODE=true on every node to allow it")
        elif dest not in allowed:
            problems.append(f"{FIELD}: {flag} ({dest}) is not allowed on this node; a node allows more SGLang "
                            "options with SIE_SGLANG_EXTRA_ARGS (every node that may run the model)")
    return problems


def resolved_extra(extra: Sequence[str], table: ArgTable | None = None) -> dict[str, Any]:
    """The destinations ``extra`` sets (``{}`` when it does not parse: the policy refuses it anyway)."""
    try:
        return (table or sglang_table()).resolve(list(extra))
    except ArgsRefused:
        return {}


def check_launch(base: Sequence[str], extra: Sequence[str], table: ArgTable | None = None) -> dict[str, Any]:
    """The destinations SGLang gets from ``base`` (SIE's own arguments) followed by ``extra`` (the spec's), or
    ``ArgsRefused`` when ``extra`` sets a destination SIE sets (even to the same value) or moves one of ``base``'s."""
    table = table or sglang_table()
    fixed = table.resolve(base)
    own = set(table.resolve(extra)) & (set(FIXED) | set(fixed))
    if own:
        raise ArgsRefused(f"{FIELD}: {', '.join(sorted(own))} is set by SIE itself; refused")
    everything = table.resolve([*base, *extra])
    moved = sorted(d for d, v in fixed.items() if everything.get(d) != v)
    if moved:
        raise ArgsRefused(f"{FIELD}: SGLang would not start with SIE's {', '.join(moved)}; refused")
    return everything


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
