"""The GPU sampler against a stand-in for NVIDIA's management library (no driver on this machine):
it samples only the worker's visible devices, and without the library it reports nothing."""

from __future__ import annotations

import sys
import time
import types

import pytest

from gpufn_dagster.refresh.gpu_stats import GpuSampler


def fake_pynvml(utilization: dict[int, list[int]], memory: dict[int, int]) -> types.ModuleType:
    """Devices by index, each returning its utilization samples in turn (the last one repeats)."""
    module = types.ModuleType("pynvml")
    state = {"init": 0, "shutdown": 0}
    module.state = state
    module.nvmlInit = lambda: state.__setitem__("init", state["init"] + 1)
    module.nvmlShutdown = lambda: state.__setitem__("shutdown", state["shutdown"] + 1)
    module.nvmlDeviceGetCount = lambda: len(utilization)
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetHandleByUUID = lambda uuid: int(uuid.rsplit("-", 1)[1])

    def rates(handle: int) -> types.SimpleNamespace:
        samples = utilization[handle]
        return types.SimpleNamespace(gpu=samples.pop(0) if len(samples) > 1 else samples[0])

    module.nvmlDeviceGetUtilizationRates = rates
    module.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(used=memory[handle])
    return module


def test_samples_only_the_visible_devices(monkeypatch):
    nvml = fake_pynvml({0: [100], 1: [20, 40, 60]}, {0: 70 << 30, 1: 5 << 30})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    with GpuSampler(every=0.01) as gpu:
        time.sleep(0.1)
    figures = gpu.figures()
    assert figures["gpu_devices"] == 1
    assert figures["gpu_memory_peak_bytes"] == 5 << 30  # device 0's 70 GiB is another worker's
    assert 20 < figures["gpu_utilization_mean_percent"] <= 60
    assert nvml.state == {"init": 1, "shutdown": 1}


def test_devices_named_by_uuid_and_all_devices_without_the_variable(monkeypatch):
    nvml = fake_pynvml({0: [10], 1: [30]}, {0: 1, 1: 2})
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-abc-1")
    with GpuSampler(every=0.01) as gpu:
        time.sleep(0.03)
    assert gpu.figures()["gpu_utilization_mean_percent"] == 30
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with GpuSampler(every=0.01) as gpu:
        time.sleep(0.03)
    assert gpu.figures()["gpu_devices"] == 2 and gpu.figures()["gpu_utilization_mean_percent"] == 20


@pytest.mark.parametrize("broken", ["no module", "no driver"])
def test_without_the_library_or_a_driver_nothing_is_reported(monkeypatch, broken):
    if broken == "no module":
        monkeypatch.setitem(sys.modules, "pynvml", None)  # import raises ImportError
    else:
        nvml = fake_pynvml({}, {})

        def no_driver():
            raise RuntimeError("NVML Shared Library Not Found")

        nvml.nvmlInit = no_driver
        monkeypatch.setitem(sys.modules, "pynvml", nvml)
    with GpuSampler(every=0.01) as gpu:
        pass
    assert gpu.figures() == {}
