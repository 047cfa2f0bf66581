"""Run vLLM's OpenAI-compatible server from an SGLang launch command line: the ``server_entry`` an agent-run
sglang replica uses to run a real vLLM instead of ``python -m sglang.launch_server``.

    <server venv>/bin/python scripts/real_llm/vllm_entry.py [VLLM SERVE FLAGS...] --model-path M --host H
        --port P [--served-model-name N] [--max-running-requests K] [--context-length L] [--tp-size T] [...]

The worker builds an SGLang command line (``sie.workers.sglang_launcher.build_launch``: ``--model-path``,
``--host``, ``--port``, ``--tp-size``, ``--served-model-name``, ``--enable-metrics``, ``--device``,
``--context-length`` and the spec's ``extra_args``, which the node's spec policy allows only as SGLang
options it lists, e.g. ``--max-running-requests``, ``--dtype``) and runs it with the spec's ``server_entry``
in front, which the node must allow (``SIE_SGLANG_SERVER_ENTRIES``).  So vLLM's own flags come with the entry,
chosen by the node, never by the spec: everything before ``--model-path`` (the launcher's first flag) goes to
``vllm serve`` unchanged.  This program maps the SGLang flags that have a vLLM meaning and execs ``vllm
serve`` (replacing itself, so the worker's child IS the server: its exit, its SIGKILL, its PR_SET_PDEATHSIG):

    --model-path M            -> vllm serve M
    --host/--port             -> --host/--port
    --served-model-name N     -> --served-model-name N
    --max-running-requests K  -> --max-num-seqs K     (what the server runs at once: the window's C)
    --context-length L        -> --max-model-len L
    --tp-size T               -> --tensor-parallel-size T
    --dtype D                 -> --dtype D
    --enable-metrics          -> (vLLM always serves /metrics)
    --device, --mem-fraction-static, --base-gpu-id  -> ignored on CPU (vLLM's CPU build; its KV cache is
                                 VLLM_CPU_KVCACHE_SPACE GiB, set by this program to 1 unless already set)

An SGLang flag it cannot map is an error that names it (never silently dropped).  Standalone (stdlib only): it runs in the server's virtualenv, not SIE's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MAPPED = {"--host": "--host", "--port": "--port", "--served-model-name": "--served-model-name",
          "--max-running-requests": "--max-num-seqs", "--context-length": "--max-model-len",
          "--tp-size": "--tensor-parallel-size", "--dtype": "--dtype"}
IGNORED_WITH_VALUE = {"--device", "--mem-fraction-static", "--base-gpu-id"}
IGNORED = {"--enable-metrics"}


def vllm_argv(argv: list[str], vllm: str) -> list[str]:
    """The ``vllm serve`` command for an SGLang launch command line (module docstring)."""
    first = next((i for i, a in enumerate(argv) if a == "--model-path" or a.startswith("--model-path=")), len(argv))
    passthrough, argv = argv[:first], argv[first:]  # the entry's own vLLM flags (module docstring)
    model = None
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag, value = argv[i], None
        if "=" in flag and flag.startswith("--"):
            flag, value = flag.split("=", 1)
        takes = flag == "--model-path" or flag in MAPPED or flag in IGNORED_WITH_VALUE
        if takes and value is None:
            if i + 1 >= len(argv):
                raise SystemExit(f"vllm_entry: {flag} needs a value")
            value, i = argv[i + 1], i + 1
        if flag == "--model-path":
            model = value
        elif flag in MAPPED:
            out += [MAPPED[flag], str(value)]
        elif flag not in IGNORED and flag not in IGNORED_WITH_VALUE:
            raise SystemExit(f"vllm_entry: the SGLang flag {flag} has no vLLM mapping here; vLLM's own flags go in "
                             f"the node's server entry, before --model-path")
        i += 1
    if not model:
        raise SystemExit("vllm_entry: --model-path is required")
    return [vllm, "serve", model, *out, *passthrough]


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    vllm = str(Path(sys.executable).with_name("vllm"))
    command = vllm_argv(args, vllm)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    sys.stdout.write("vllm_entry: exec " + " ".join(command) + "\n")
    sys.stdout.flush()
    os.execv(command[0], command)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main())
