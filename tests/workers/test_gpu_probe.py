"""GPU probe: empty on CPU-only nodes, unhealthy GPUs reported (not dropped), simulated inventories parse."""

from __future__ import annotations

import dataclasses
import json
from types import SimpleNamespace

import fastavro
import pytest

from sie.kernel.errors import ConfigError
from sie.workers.gpu import GpuInfo, HostInventory, host_inventory, parse_simulated_gpus, probe_gpus
from tests.support.helpers import REPO_ROOT

ROOT = REPO_ROOT


def _nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


class FakeNvml:
    """Just enough of pynvml: two GPUs, the second of which fails its memory query."""

    class NVMLError(Exception):
        pass

    NVML_TEMPERATURE_GPU = 0

    def __init__(self, init_fails: bool = False) -> None:
        self.init_fails = init_fails
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-fake-{handle}".encode()

    def nvmlDeviceGetName(self, handle: int) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetMemoryInfo(self, handle: int):
        if handle == 1:
            raise self.NVMLError("Unknown Error")
        mib = 1024 * 1024
        return SimpleNamespace(total=143_771 * mib, used=1_000 * mib, free=142_771 * mib)

    def nvmlDeviceGetUtilizationRates(self, handle: int):
        return SimpleNamespace(gpu=37)

    def nvmlDeviceGetTemperature(self, handle: int, sensor: int) -> int:
        return 41


def test_real_probe_is_empty_without_a_driver_and_never_raises() -> None:
    gpus = probe_gpus()
    if _nvml_available():
        assert gpus and all(g.memory_total_mb > 0 and not g.simulated for g in gpus)
    else:
        assert gpus == []


def test_probe_with_failing_init_is_empty() -> None:
    assert probe_gpus(FakeNvml(init_fails=True)) == []


def test_probe_reports_each_gpu_and_marks_a_broken_one_unhealthy() -> None:
    nvml = FakeNvml()
    good, broken = probe_gpus(nvml)
    assert good == GpuInfo(0, "GPU-fake-0", "NVIDIA H200", 143_771, 1_000, 142_771, 37.0, 41.0, False, True)
    assert (broken.index, broken.uuid, broken.healthy, broken.memory_total_mb) == (1, "GPU-fake-1", False, 0)
    assert nvml.shutdowns == 1


def test_simulated_inventory() -> None:
    gpus = parse_simulated_gpus("2xA100-80GB, 1xL4-24GB,1xT4", node="node-a")
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert [g.memory_total_mb for g in gpus] == [81_920, 81_920, 24_576, 16_384]
    assert all(g.simulated and g.healthy and g.memory_free_mb == g.memory_total_mb and g.memory_used_mb == 0 for g in gpus)
    assert len({g.uuid for g in gpus}) == 4 and all("node-a" in g.uuid for g in gpus)
    assert "A100" in gpus[0].product and "L4" in gpus[2].product
    # an unknown product is fine when its memory is given
    [custom] = parse_simulated_gpus("1xMI300X-192GB", node="n")
    assert custom.memory_total_mb == 192 * 1024


@pytest.mark.parametrize(
    "bad",
    ["", "A100", "2A100", "0xA100", "2xA100-80", "2xA100-80GB;1xL4", "x", "2xMI300X", "1xL4-0GB", "-1xL4"],
)
def test_bad_simulated_strings_are_config_errors_with_an_example(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"simulated GPUs: .*(e\.g\.|must be >= 1)"):
        parse_simulated_gpus(bad, node="n")


def test_host_inventory_counts_cpus_memory_and_gpus() -> None:
    inventory = host_inventory(simulated_gpus="2xH100", hostname="node-b")
    assert isinstance(inventory, HostInventory)
    assert inventory.hostname == "node-b"
    assert inventory.cpu_count >= 1
    assert inventory.memory_mb > 0 and 0 < inventory.memory_available_mb <= inventory.memory_mb
    assert inventory.gpu_memory_total_mb == 2 * 81_920
    assert host_inventory(probe=lambda: []).gpus == ()


def test_gpu_info_matches_the_avro_record() -> None:
    schema_file = ROOT / "schemas" / "avro" / "GpuInfo.avsc"
    avro_fields = [f["name"] for f in json.loads(schema_file.read_text())["fields"]]
    assert [f.name for f in dataclasses.fields(GpuInfo)] == avro_fields
    parsed = fastavro.parse_schema(json.loads(schema_file.read_text()))
    for gpu in parse_simulated_gpus("1xL4", node="n"):
        assert fastavro.validate(dataclasses.asdict(gpu), parsed)
