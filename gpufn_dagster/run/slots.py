"""Embedded mode: which local slots of its class -- and so which devices -- a GPU step runs on.

A slot is one GPU. The class's pool (`gpu-<class>`) lets at most `local.slots` of its steps run at
once, but does not say which slots a step got, nor count GPUs (a Dagster pool counts steps). A
step asking for N GPUs takes the N lowest slots whose lock files no other process holds -- all of
them or none, so two steps never each hold half of what they need -- (exclusive `flock`s, which
the kernel releases if the step dies, so a killed step never keeps a slot) and sees their
devices, `local.devices[slot % len(devices)]`, as CUDA_VISIBLE_DEVICES, comma-separated. A step
whose GPUs are partly held by others waits here, saying so in its log.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..classes import GpuClass
from ..tags import PLACEMENT_TAG, RunKind


@contextmanager
def local_slots(gpu_class: GpuClass, lock_dir: Path, gpus: int = 1, on_wait: Callable[[str], None] = print,
                poll_seconds: float = 1.0, report_every: float = 30.0) -> Iterator[tuple[list[int], list[str]]]:
    """Hold `gpus` free local slots of `gpu_class` while the block runs; yields (the slots, their devices).

    Normally the slots are free at once (the pool admitted the step). A step run outside the
    embedded coordinator's pool limits, or one asking for more GPUs than are free now, waits,
    saying so every `report_every` seconds through `on_wait`.

    Args:
        gpu_class: the step's class (`local.slots`, `local.devices`).
        lock_dir: where the slot lock files live (the Dagster instance's directory).
        gpus: how many slots (GPUs) the step needs; at most `local.slots` (the coordinator refuses more).
        on_wait: where to say that the step waits for slots.
        poll_seconds: how often a waiting step tries again.
        report_every: how often a waiting step says so.
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    slots = max(gpu_class.local.slots, 1)
    if gpus > slots:
        raise ValueError(f"{gpus} GPUs asked of class {gpu_class.name!r}, which has {slots} local slot(s)")
    started = reported = time.monotonic()
    while True:
        held: list[tuple[int, Any]] = []
        for slot in range(slots):
            handle = open(lock_dir / f"{gpu_class.name}.{slot}.lock", "a")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            held.append((slot, handle))
            if len(held) == gpus:
                break
        if len(held) == gpus:
            try:
                devices = gpu_class.local.devices
                yield [slot for slot, _ in held], [devices[slot % len(devices)] for slot, _ in held] if devices else []
            finally:
                _release(held)
            return
        _release(held)  # all or none: never sit on part of what another step needs
        if time.monotonic() - reported >= report_every:
            reported = time.monotonic()
            on_wait(f"{gpus} local slot(s) of GPU class {gpu_class.name!r} needed, {len(held)} of {slots} free: the "
                    f"others are held by other steps on this machine (pid {os.getpid()} waited "
                    f"{reported - started:.0f}s so far)")
        time.sleep(poll_seconds)


def _release(held: list[tuple[int, Any]]) -> None:
    for _, handle in held:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@dataclass(frozen=True)
class HeldSlots:
    """The local slots a step holds, their devices, and the directory of the slot locks."""

    slots: tuple[int, ...]
    devices: tuple[str, ...]
    lock_dir: Path


@contextmanager
def step_slot(context: Any, gpu_class: GpuClass | None, gpus: int = 1) -> Iterator[HeldSlots | None]:
    """Embedded mode: hold `gpus` of the class's local slots (and their devices) while a GPU step
    runs; yields what it holds (the step's warm Function instances live there: `refresh.warm`).

    The pool let the step start; the slots say which devices it uses (CUDA_VISIBLE_DEVICES), in
    the step's own process. Outside the embedded coordinator (Kubernetes, `materialize`) nothing
    is held (the pod was given its GPUs) and None is yielded.
    """
    if gpu_class is None or context.run.tags.get(PLACEMENT_TAG) != RunKind.LOCAL.value:
        yield None
        return
    lock_dir = Path(context.instance.root_directory) / "gpufn-slots"
    with local_slots(gpu_class, lock_dir, gpus, on_wait=context.log.warning) as (slots, devices):
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        context.log.info(f"local GPU slot{'s' if len(slots) > 1 else ''} {', '.join(map(str, slots))} of class "
                         f"{gpu_class.name!r}"
                         + (f", CUDA_VISIBLE_DEVICES={','.join(devices)}" if devices else ""))
        try:
            yield HeldSlots(tuple(slots), tuple(devices), lock_dir)
        finally:  # a run worker running its steps itself (in_process) goes on to other steps
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
