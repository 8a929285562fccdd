"""What the GPU did during a refresh: mean utilization and peak memory of the worker's visible devices.

Read from NVIDIA's management library through `nvidia-ml-py` (module `pynvml`), imported only
here and only when a refresh starts. Where the package, the driver or a device is missing the
sampler samples nothing and the materialization simply carries no GPU figures; a refresh never
fails for them.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any


def _visible(pynvml: Any) -> list[Any]:
    """Handles of the devices this process may use: CUDA_VISIBLE_DEVICES (indices or UUIDs), else all."""
    wanted = os.environ.get("CUDA_VISIBLE_DEVICES")
    if wanted is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    handles = []
    for item in (w.strip() for w in wanted.split(",") if w.strip()):
        handles.append(pynvml.nvmlDeviceGetHandleByIndex(int(item)) if item.isdigit()
                       else pynvml.nvmlDeviceGetHandleByUUID(item))
    return handles


def _name(pynvml: Any, handle: Any) -> str:
    try:
        name = pynvml.nvmlDeviceGetName(handle)
        return name.decode() if isinstance(name, bytes) else str(name)
    except Exception:
        return "NVIDIA GPU"


def visible_gpus(sampled: tuple[str, ...]) -> tuple[str, ...]:
    """The GPUs a worker computed on: those NVIDIA's library saw, else CUDA devices torch sees when the
    Function loaded torch (a worker without nvidia-ml-py), else none -- it computed on a CPU."""
    if sampled:
        return sampled
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available():
            return tuple(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception:  # a broken CUDA setup computes on no GPU
        pass
    return ()


class GpuSampler:
    """Samples the visible devices every `every` seconds in its own thread while the block runs.

    >>> with GpuSampler() as gpu:  # no NVIDIA driver here: nothing sampled, nothing reported
    ...     pass
    >>> gpu.figures() == {} or "gpu_utilization_mean_percent" in gpu.figures()
    True
    """

    def __init__(self, every: float = 1.0):
        self.every = every
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._pynvml: Any = None
        self._handles: list[Any] = []
        self._utilization: list[float] = []
        self._peak_memory = 0
        self.devices: tuple[str, ...] = ()  # the GPUs this worker sees, by name ("NVIDIA H100 80GB HBM3 (0)")

    def __enter__(self) -> GpuSampler:
        try:
            pynvml = importlib.import_module("pynvml")
            pynvml.nvmlInit()
        except Exception:  # no package, no driver: no figures
            return self
        try:
            self._handles = _visible(pynvml)
        except Exception:
            pynvml.nvmlShutdown()
            return self
        if self._handles:
            self.devices = tuple(_name(pynvml, handle) for handle in self._handles)
            self._pynvml = pynvml
            self._thread = threading.Thread(target=self._run, name="gpufn-gpu-sampler", daemon=True)
            self._thread.start()
        else:
            pynvml.nvmlShutdown()
        return self

    def _sample(self) -> None:
        for handle in self._handles:
            self._utilization.append(float(self._pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
            self._peak_memory = max(self._peak_memory, int(self._pynvml.nvmlDeviceGetMemoryInfo(handle).used))

    def _run(self) -> None:
        while True:
            try:
                self._sample()
            except Exception:
                return  # a device that went away ends the sampling, not the refresh
            if self._stop.wait(self.every):
                return

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._pynvml.nvmlShutdown()

    def figures(self) -> dict[str, float]:
        """Mean utilization (percent) and peak memory used (bytes) over the samples; {} without samples."""
        if not self._utilization:
            return {}
        return {"gpu_utilization_mean_percent": round(sum(self._utilization) / len(self._utilization), 1),
                "gpu_memory_peak_bytes": float(self._peak_memory), "gpu_devices": float(len(self._handles))}
