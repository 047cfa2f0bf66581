"""Build the ``python -m sglang.launch_server`` command for one replica, with an ABSOLUTE memory budget.

Why the fraction is computed here: SGLang's ``--mem-fraction-static`` is a
fraction of the GPU memory that is FREE when the server starts (weights + KV
pool), so two servers on one GPU would get budgets that depend on start order
(SGLang #3265).  The control plane reserves an absolute ``gpu_memory_mb`` per
replica; right before launch the worker measures the free memory with NVML and
asks for ``budget / free``.  A budget larger than what is free is an error that
says so, never a silently smaller or larger server.

NOT YET RUN AGAINST REAL SGLANG (no GPU on the development machines): the flags
follow SGLang's documented server arguments; tests drive the same command line
against ``tests/fakes/fake_sglang.py``.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sie.schemas.sglang_args import ArgsRefused, check_launch
from sie.workers.backends.base import BackendError

#: keep this share of free memory out of SGLang's static pool (CUDA context, activations, other tenants' growth)
MAX_FRACTION = 0.95
MIN_FRACTION = 0.01


@dataclass(frozen=True)
class SGLangLaunch:
    argv: tuple[str, ...]
    port: int
    mem_fraction_static: float | None


def compute_mem_fraction(budget_mb: int, free_mb: int, gpu_index: int, model_id: str = "<model>") -> float:
    """``budget / free`` clamped to [MIN_FRACTION, MAX_FRACTION]; a budget above free memory is an error."""
    if budget_mb <= 0:
        raise BackendError(
            f"{model_id}: spec.resources.gpuMemoryMb must be > 0 for an sglang replica on GPU {gpu_index} "
            f"(got {budget_mb}); declare the weights + KV cache budget in MiB"
        )
    if free_mb <= 0 or budget_mb > free_mb:
        raise BackendError(
            f"{model_id}: GPU {gpu_index} has {free_mb} MiB free but the replica's budget is {budget_mb} MiB "
            f"(spec.resources.gpuMemoryMb); free the GPU or lower the budget"
        )
    return round(min(MAX_FRACTION, max(MIN_FRACTION, budget_mb / free_mb)), 4)


def nvml_free_mb(gpu_index: int, nvml: Any = None) -> int | None:
    """Free MiB on a physical GPU right now, or None if NVML cannot tell (no driver, simulated GPU)."""
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(gpu_index)
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).free // (1024 * 1024))
    except Exception:
        return None
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def build_launch(
    config: Any,
    port: int | None = None,
    free_mb: Callable[[int], int | None] = nvml_free_mb,
    python: str = sys.executable,
) -> SGLangLaunch:
    """The server command for a ``BackendConfig`` of type sglang.

    Reads ``config.model_path`` and ``config.config``: ``tp_size`` (default: number of GPUs reserved, else 1),
    ``max_seq_len`` -> ``--context-length``, ``served_model_name`` (default: the model name),
    ``mem_fraction_static`` (only used when NVML cannot measure, e.g. CPU or simulated GPUs),
    ``extra_args`` (list, appended after SIE's own arguments once ``sglang_args.check_launch`` proved they
    set none of SIE's destinations; the node's spec policy allowed them already), ``server_entry`` (argv prefix replacing
    ``python -m sglang.launch_server``, only one the node's spec policy allows: SIE_SGLANG_SERVER_ENTRIES;
    tests point it at the fake server), and what the worker adds:
    ``gpu_indices`` (physical NVML indices) and ``gpu_memory_mb`` (absolute budget per GPU).
    """
    cfg: Mapping[str, Any] = config.config
    model_id = config.model_id
    if not config.model_path:
        raise BackendError(f"{model_id}: spec.backend.model_path is required for an sglang backend (HF dir or hub id)")
    gpu_indices: Sequence[int] = tuple(int(i) for i in cfg.get("gpu_indices") or ())
    tp_size = int(cfg.get("tp_size") or max(1, len(gpu_indices)))
    if gpu_indices and tp_size > len(gpu_indices):
        raise BackendError(
            f"{model_id}: spec.backend.config.tp_size={tp_size} but only {len(gpu_indices)} GPU(s) were reserved; "
            f"set spec.resources.gpus to {tp_size}"
        )
    port = port or free_port()
    name = str(cfg.get("served_model_name") or model_id.split(":")[0])
    entry = list(cfg.get("server_entry") or (python, "-m", "sglang.launch_server"))
    argv = [
        *entry,
        "--model-path", str(config.model_path),
        "--host", "127.0.0.1",
        "--port", str(port),
        "--tp-size", str(tp_size),
        "--served-model-name", name,
        "--enable-metrics",
    ]
    if cfg.get("max_seq_len"):
        argv += ["--context-length", str(int(cfg["max_seq_len"]))]
    fraction: float | None = None
    if gpu_indices:
        # The agent sets CUDA_VISIBLE_DEVICES to the reserved GPUs, so the first one is visible index 0;
        # NVML (below) ignores CUDA_VISIBLE_DEVICES and needs the physical index.
        argv += ["--base-gpu-id", "0"]
        budget = int(cfg.get("gpu_memory_mb") or 0)
        measured = [m for i in gpu_indices if (m := free_mb(i)) is not None]
        if len(measured) == len(gpu_indices):
            # With tensor parallelism SGLang takes the MIN free memory over its ranks as the base of the
            # fraction, so the budget is divided by the tightest GPU's free memory (each rank gets the budget).
            tightest, tight_free = min(zip(gpu_indices, measured), key=lambda pair: int(pair[1]))
            fraction = compute_mem_fraction(budget, int(tight_free), tightest, model_id)
        elif cfg.get("mem_fraction_static") is not None:
            fraction = float(cfg["mem_fraction_static"])
        else:
            raise BackendError(
                f"{model_id}: cannot measure free memory on GPU(s) {list(gpu_indices)} with NVML (no driver or "
                f"simulated GPUs); set spec.backend.config.mem_fraction_static to launch anyway"
            )
    else:
        argv += ["--device", str(cfg.get("device_override") or "cpu")]
        if cfg.get("mem_fraction_static") is not None:
            fraction = float(cfg["mem_fraction_static"])
    if fraction is not None:
        argv += ["--mem-fraction-static", f"{fraction:g}"]
    extra = [str(a) for a in cfg.get("extra_args") or ()]
    try:  # the spec policy allowed extra_args; this proves SIE's own arguments still hold once they are appended
        check_launch(argv[len(entry):], extra)
    except ArgsRefused as exc:
        raise BackendError(f"{model_id}: {exc}") from None
    argv += extra
    return SGLangLaunch(argv=tuple(argv), port=port, mem_fraction_static=fraction)
