"""What this node has: GPUs (via NVML, or simulated) and host CPU/memory.

A node agent reports this inventory so the control plane can place models by GPU memory. Three facts shape it:
  * A CPU-only node is normal, not an error: no driver / no NVML library -> an empty GPU list.
  * A GPU that NVML cannot query is reported ``healthy=False`` rather than dropped, so placement avoids it and
    operators see it.
  * Development machines have no GPUs, so ``parse_simulated_gpus("2xA100-80GB,1xL4-24GB")`` fabricates an
    inventory (``simulated=True``) that exercises the placement logic end to end.

``GpuInfo`` mirrors the Avro ``GpuInfo`` record field for field.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sie.kernel.errors import ConfigError


@dataclass(frozen=True)
class GpuInfo:
    index: int
    uuid: str
    product: str
    memory_total_mb: int
    memory_used_mb: int
    memory_free_mb: int
    utilization_pct: float
    temperature_c: float
    simulated: bool = False
    healthy: bool = True


@dataclass(frozen=True)
class HostInventory:
    hostname: str
    cpu_count: int
    memory_mb: int
    memory_available_mb: int
    gpus: tuple[GpuInfo, ...] = ()

    @property
    def gpu_memory_total_mb(self) -> int:
        return sum(g.memory_total_mb for g in self.gpus if g.healthy)


# --- NVML -----------------------------------------------------------------------------------------------------

_MIB = 1024 * 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _probe_one(nvml: Any, index: int) -> GpuInfo:
    """Query one device; any NVML failure after the handle marks the GPU unhealthy instead of hiding it."""
    handle = nvml.nvmlDeviceGetHandleByIndex(index)
    uuid, product = f"GPU-unknown-{index}", "unknown"
    try:
        uuid = _text(nvml.nvmlDeviceGetUUID(handle))
        product = _text(nvml.nvmlDeviceGetName(handle))
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        total, used, free = memory.total // _MIB, memory.used // _MIB, memory.free // _MIB
    except nvml.NVMLError:
        return GpuInfo(index, uuid, product, 0, 0, 0, 0.0, 0.0, simulated=False, healthy=False)
    try:
        utilization = float(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
    except nvml.NVMLError:  # not supported on some products (e.g. MIG instances): unknown, not unhealthy
        utilization = 0.0
    try:
        temperature = float(nvml.nvmlDeviceGetTemperature(handle, nvml.NVML_TEMPERATURE_GPU))
    except nvml.NVMLError:
        temperature = 0.0
    return GpuInfo(index, uuid, product, int(total), int(used), int(free), utilization, temperature)


def probe_gpus(nvml: Any = None) -> list[GpuInfo]:
    """Every GPU NVML sees, or ``[]`` on a CPU-only node (no driver, no library, NVML error). Never raises.

    ``nvml`` is injectable for tests; by default the ``pynvml`` module from ``nvidia-ml-py``.
    """
    try:
        if nvml is None:
            import pynvml as nvml  # type: ignore[no-redef]
        nvml.nvmlInit()
    except Exception:  # ImportError, NVMLError_LibraryNotFound, NVMLError_DriverNotLoaded, ...
        return []
    try:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError:
            return []
        gpus = []
        for index in range(count):
            try:
                gpus.append(_probe_one(nvml, index))
            except nvml.NVMLError:
                gpus.append(GpuInfo(index, f"GPU-unknown-{index}", "unknown", 0, 0, 0, 0.0, 0.0, healthy=False))
        return gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


# --- simulated GPUs -------------------------------------------------------------------------------------------

#: Default memory (MiB) of products a simulated spec may name without a memory suffix.
KNOWN_GPUS_MB: dict[str, int] = {
    "A100": 40_960,
    "A10G": 24_576,
    "A10": 24_576,
    "H100": 81_920,
    "H200": 143_360,
    "B200": 184_320,
    "L4": 24_576,
    "L40S": 46_080,
    "T4": 16_384,
    "V100": 16_384,
}
_SIM_EXAMPLE = "2xA100-80GB,1xL4"
_SIM_ITEM = re.compile(r"^(?P<count>\d+)\s*[xX]\s*(?P<product>[A-Za-z][A-Za-z0-9]*)(?:-(?P<gb>\d+)\s*GB)?$")


def parse_simulated_gpus(text: str, node: str | None = None) -> list[GpuInfo]:
    """Parse ``"<count>x<PRODUCT>[-<N>GB],..."`` into simulated, idle, healthy GPUs indexed from 0.

    The memory suffix overrides the product's default; an unknown product needs one. UUIDs embed ``node`` (the
    hostname by default) so simulated GPUs on different nodes never collide.
    """
    node = node or socket.gethostname()
    items = [item.strip() for item in (text or "").split(",") if item.strip()]
    if not items:
        raise ConfigError(f"simulated GPUs: empty specification {text!r}; write e.g. {_SIM_EXAMPLE!r}")
    gpus: list[GpuInfo] = []
    for item in items:
        match = _SIM_ITEM.fullmatch(item)
        if match is None:
            raise ConfigError(
                f"simulated GPUs: cannot parse {item!r}; write <count>x<product>[-<memory>GB], e.g. {_SIM_EXAMPLE!r}"
            )
        count = int(match["count"])
        product = match["product"].upper()
        if count < 1:
            raise ConfigError(f"simulated GPUs: {item!r} asks for {count} GPUs; the count must be >= 1")
        if match["gb"] is not None:
            memory_mb = int(match["gb"]) * 1024
            if memory_mb <= 0:
                raise ConfigError(f"simulated GPUs: {item!r} has no memory; use e.g. '{count}x{product}-24GB'")
        elif product in KNOWN_GPUS_MB:
            memory_mb = KNOWN_GPUS_MB[product]
        else:
            raise ConfigError(
                f"simulated GPUs: unknown product {product!r} in {item!r}; add its memory, e.g. "
                f"'{count}x{product}-24GB', or use one of {', '.join(sorted(KNOWN_GPUS_MB))}"
            )
        label = f"NVIDIA {product}-{memory_mb // 1024}GB (simulated)"
        for _ in range(count):
            index = len(gpus)
            gpus.append(
                GpuInfo(
                    index=index,
                    uuid=f"GPU-SIM-{node}-{index}",
                    product=label,
                    memory_total_mb=memory_mb,
                    memory_used_mb=0,
                    memory_free_mb=memory_mb,
                    utilization_pct=0.0,
                    temperature_c=0.0,
                    simulated=True,
                    healthy=True,
                )
            )
    return gpus


# --- host -----------------------------------------------------------------------------------------------------


def _meminfo_mb(path: str = "/proc/meminfo") -> tuple[int, int]:
    """(total, available) MiB from /proc/meminfo; (0, 0) where it does not exist (non-Linux)."""
    values: dict[str, int] = {}
    try:
        with open(path) as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                parts = rest.split()
                if parts:
                    values[key] = int(parts[0])  # kB
    except OSError:
        return 0, 0
    total = values.get("MemTotal", 0) // 1024
    return total, values.get("MemAvailable", values.get("MemFree", 0)) // 1024


def _cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))  # respects cgroup/taskset pinning, unlike os.cpu_count()
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def host_inventory(
    simulated_gpus: str | None = None,
    probe: Callable[[], list[GpuInfo]] = probe_gpus,
    hostname: str | None = None,
) -> HostInventory:
    """This node's CPUs, memory and GPUs: simulated ones when ``simulated_gpus`` is set, else NVML's."""
    hostname = hostname or socket.gethostname()
    gpus = parse_simulated_gpus(simulated_gpus, node=hostname) if simulated_gpus else probe()
    total, available = _meminfo_mb()
    return HostInventory(
        hostname=hostname,
        cpu_count=_cpu_count(),
        memory_mb=total,
        memory_available_mb=available,
        gpus=tuple(gpus),
    )
