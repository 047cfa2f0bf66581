"""Hole 1 (high): SGLang options reached by abbreviation, alias or repetition through ``extra_args``.

SGLang's parser is argparse with ``allow_abbrev``: ``--trust-remote`` is ``--trust-remote-code``, ``--model`` is
``--model-path``, and a repeated ``--host`` wins over SIE's.  ``extra_args`` are now resolved with SGLang's own
argument table (pinned from the real parser by scripts/sglang_contract.py) and compared by destination with an
allow-list; the launcher proves SIE's own arguments still hold on the command line it runs.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from sie.kernel.errors import ConfigError
from sie.kernel.settings import Settings
from sie.schemas.sglang_args import ALLOWED_DESTS, FIXED, TRUST_REMOTE_CODE, allowed_dests, sglang_table
from sie.schemas.spec import load
from sie.schemas.spec_policy import SpecPolicy
from sie.workers.backends.base import BackendConfig, BackendError, FieldRef
from sie.workers.sglang_launcher import build_launch
from tests.support.llm_fixtures import llm_spec_doc

TABLE = sglang_table()
FIELD = "spec.backend.config.extra_args"
#: destinations that run code, read files or move the server: never set by an accepted spec on a default node
DANGEROUS = {"trust_remote_code", "enable_custom_logit_processor", "config", "model_path", "host", "port", "help",
             "chat_template", "tokenizer_path", "load_format", "download_dir", "api_key", "ssl_keyfile",
             "speculative_draft_model_path", "lora_paths", "custom_weight_loader", "forward_hooks"}


def _problems(policy: SpecPolicy, extra: list[str], **config: Any) -> list[str]:
    return policy.check(load(llm_spec_doc([], extra_args=extra, **config)))


def _sglang_like_parser() -> argparse.ArgumentParser:
    """An oracle built straight from the pinned table the way SGLang builds its own: argparse, allow_abbrev on,
    no pre-check of spellings (what SGLang does with whatever reaches it)."""
    parser = argparse.ArgumentParser(prog="sglang serve", add_help=False, allow_abbrev=TABLE.allow_abbrev,
                                     argument_default=argparse.SUPPRESS, exit_on_error=False)
    for action in TABLE.actions:
        if action.nargs == 0:
            parser.add_argument(*action.options, dest=action.dest, action="store_const", const=True)
        else:
            parser.add_argument(*action.options, dest=action.dest, nargs=action.nargs)
    return parser


def test_the_pinned_table_is_sglangs_parser_with_abbreviations_on():
    assert TABLE.version == "0.5.23" and TABLE.allow_abbrev and len(TABLE.actions) > 500
    # the mechanism of the hole, on the oracle: these spellings ARE the dangerous options for SGLang
    oracle = _sglang_like_parser()
    assert vars(oracle.parse_args(["--trust-remote"])) == {"trust_remote_code": True}
    assert vars(oracle.parse_args(["--trust-remote-cod"])) == {"trust_remote_code": True}
    assert vars(oracle.parse_args(["--model", "/etc"])) == {"model_path": "/etc"}
    assert vars(oracle.parse_args(["--enable-custom-logit"])) == {"enable_custom_logit_processor": True}


def test_the_allow_list_names_real_destinations_and_none_sie_sets():
    assert ALLOWED_DESTS <= TABLE.dests and set(FIXED) <= TABLE.dests
    assert not ALLOWED_DESTS & set(FIXED) and not ALLOWED_DESTS & DANGEROUS


@pytest.mark.parametrize(("extra", "reason"), [
    (["--trust-remote"], "'--trust-remote' abbreviates --trust-remote-code (trust_remote_code); spell options in full"),
    (["--trust-remote-cod"], "abbreviates --trust-remote-code (trust_remote_code)"),
    (["--trust-remote-code"], "--trust-remote-code runs Python shipped with the model; set SIE_SGLANG_TRUST_REMOTE_CODE"),
    (["--model", "/etc"], "--model (model_path) is set by SIE itself"),
    (["--model-path=/etc"], "--model-path (model_path) is set by SIE itself"),
    (["--host", "0.0.0.0"], "--host (host) is set by SIE itself: the server listens on loopback only"),
    (["--port", "80"], "--port (port) is set by SIE itself"),
    (["--enable-custom-logit-processor"], "--enable-custom-logit-processor (enable_custom_logit_processor) is not "
                                          "allowed on this node; a node allows more SGLang options with "
                                          "SIE_SGLANG_EXTRA_ARGS"),
    (["--config", "/tmp/x.yaml"], "--config (config) is not allowed on this node"),
    (["--he"], "'--he' abbreviates --help (help)"),
    (["--", "--host", "0.0.0.0"], "'--' ends SGLang's options"),
    (["--no-such-flag"], "'--no-such-flag' is not an option of SGLang 0.5.23"),
    (["--chat-template", "--trust-remote-code"], "SGLang 0.5.23 would refuse these arguments: argument --chat-template: "
                                                 "expected one argument"),
    (["--max-running-requests=many"], "invalid int value: 'many'"),
])
def test_each_way_to_reach_a_refused_option_is_refused_by_name(extra: list[str], reason: str):
    problems = _problems(SpecPolicy(), extra)
    assert problems and all(p.startswith(FIELD + ": ") for p in problems)
    assert any(reason in p for p in problems), problems


def test_tuning_options_pass_and_a_node_may_allow_more_but_never_sies_own():
    assert _problems(SpecPolicy(), ["--max-running-requests", "8", "--chunked-prefill-size=512",
                                    "--disable-radix-cache", "--dtype", "bfloat16", "--context-length", "4096"]) == []
    (twice,) = _problems(SpecPolicy(), ["--context-length", "4096"], max_seq_len=2048)
    assert "set by SIE from spec.backend.config.max_seq_len" in twice
    node = SpecPolicy.from_settings(Settings(sglang_extra_args=["--chat-template", "lora_paths"]))
    assert _problems(node, ["--chat-template", "chatml"]) == []
    assert _problems(SpecPolicy.from_settings(Settings(sglang_trust_remote_code=True)), ["--trust-remote-code"]) == []
    assert _problems(node, ["--chat-templ", "chatml"])[0].endswith("spell options in full (an abbreviation may name "
                                                                   "another option in the SGLang version a node runs)")
    with pytest.raises(ConfigError, match="SIE_SGLANG_EXTRA_ARGS: '--host' .host. is set by SIE itself"):
        SpecPolicy.from_settings(Settings(sglang_extra_args=["--host"]))
    with pytest.raises(ConfigError, match="'--nope' is not an option of SGLang 0.5.23"):
        SpecPolicy.from_settings(Settings(sglang_extra_args=["--nope"]))


def _launch(extra: list[str]) -> tuple[str, ...]:
    config = BackendConfig(type="sglang", model_path="Qwen/Qwen2-7B-Instruct", model_id="m:1",
                           config={"gpu_indices": [0], "gpu_memory_mb": 30_000, "extra_args": extra},
                           output_fields=(FieldRef("answer", "string"),))
    return build_launch(config, port=31000, free_mb=lambda _i: 60_000, python=sys.executable).argv


def test_the_launcher_refuses_extra_args_that_move_sies_own_even_if_a_policy_let_them_through():
    with pytest.raises(BackendError, match="host is set by SIE itself; refused"):
        _launch(["--host", "0.0.0.0"])
    with pytest.raises(BackendError, match="abbreviates --model-path"):
        _launch(["--model-pa", "/etc"])
    assert _launch(["--max-running-requests", "4"])[-2:] == ("--max-running-requests", "4")


_OPTIONS = sorted(TABLE.dest_of)
_option = st.sampled_from(_OPTIONS)
_spelling = st.one_of(
    _option,                                                     # exact
    _option.flatmap(lambda o: st.integers(3, max(3, len(o) - 1)).map(lambda n: o[:n])),  # a prefix
    st.builds(lambda o, v: f"{o}={v}", _option, st.sampled_from(["1", "x", "/etc", "0.0.0.0", ""])),
)
_value = st.sampled_from(["1", "8", "0.5", "/etc", "0.0.0.0", "bfloat16", "-1", "--", "auto", "x y", "chatml"])
_argv = st.lists(st.one_of(_spelling, _value), max_size=8)


@settings(max_examples=400, deadline=None)
@given(_argv)
@example(["--trust-remote"])
@example(["--model", "/etc"])
@example(["--max-running-requests", "4", "--host=0.0.0.0"])
@example(["--max-running-requests", "-1"])
def test_an_accepted_spec_never_gets_sglang_to_enable_a_refused_option_or_move_a_fixed_one(extra: list[str]):
    """Generated from SGLang's own option strings (exact, abbreviated, with values): whenever the policy accepts a
    spec, the launcher's whole command line, parsed by an SGLang-like parser with abbreviations ON, sets nothing
    outside the allow-list and keeps SIE's values."""
    policy = SpecPolicy()
    if _problems(policy, extra):
        return
    argv = _launch(extra)
    oracle = _sglang_like_parser()
    base = vars(oracle.parse_args(list(argv[3:len(argv) - len(extra)])))  # after `python -m sglang.launch_server`
    full = vars(oracle.parse_args(list(argv[3:])))
    assert {d: full[d] for d in base} == base
    assert set(full) - set(base) <= allowed_dests() and TRUST_REMOTE_CODE not in full
    assert not (set(full) - set(base)) & DANGEROUS
