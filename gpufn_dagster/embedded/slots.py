"""Embedded mode: which local slots of its class -- and so which devices -- a GPU step runs on.

A slot is one GPU. The class's pool (`gpu-<class>`) lets at most `local.slots` of its steps run at
once, but does not say which slots a step got, nor count GPUs (a Dagster pool counts steps). A
step asking for N GPUs takes the N lowest slots whose lock files no other process holds -- all of
them or none, so two steps never each hold half of what they need -- (exclusive `flock`s, which
the kernel releases if the step dies, so a killed step never keeps a slot) and sees their
devices, `local.devices[slot % len(devices)]`, as CUDA_VISIBLE_DEVICES, comma-separated. A step
whose GPUs are partly held by others waits here, saying so in its log.

A Function that accepts several classes in order (`gpu_class=["h100-80gb", "a100-80gb"]`) claims
a slot of its own pool, `gpu-h100-80gb|a100-80gb`, and here takes the slots of the first class that
has them free.

The slot locks are also the one record of who holds what: a step writes who it is (run, step,
request) into each lock file it holds, and a step whose slots are not free leaves a note under
`waiting/` until it gets them. The coordinator reads both (`held_slots`, `waiting_steps`) -- the
locks held now from /proc/locks, never by locking -- so a run is `running` only once its step holds
its slots, and a step that waits here (a choice whose classes are all held) is said to wait.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..classes import GpuClass
from .procfs import flocked
from ..tags import GOT_CLASS_TAG, PLACEMENT_TAG, RunKind, choice_request
from ..run.run_plan import choice_note, tag_got_class


WAITING_DIR = "waiting"  # under the slot locks' directory: one note per step waiting here for its slots


@contextmanager
def local_slots(accepted: tuple[GpuClass, ...], lock_dir: Path, gpus: int = 1, on_wait: Callable[[str], None] = print,
                poll_seconds: float = 1.0, report_every: float = 30.0, holder: Mapping[str, str] | None = None
                ) -> Iterator[tuple[GpuClass, list[int], list[str]]]:
    """Hold `gpus` free local slots of the first class of `accepted` that has them, while the block
    runs; yields (that class, the slots, their devices).

    Normally the slots are free at once (the pool admitted the step). A step run outside the
    embedded coordinator's pool limits, or one asking for more GPUs than are free now, waits --
    for the first of its classes (in order) to have them at a later try -- saying so every
    `report_every` seconds through `on_wait`.

    Args:
        accepted: the step's classes, first choice first (`local.slots`, `local.devices`).
        lock_dir: where the slot lock files live (the Dagster instance's directory).
        gpus: how many slots (GPUs) the step needs; at most `local.slots` (the coordinator refuses more).
        on_wait: where to say that the step waits for slots.
        poll_seconds: how often a waiting step tries again.
        report_every: how often a waiting step says so.
        holder: who asks (run_id, step_key, request): written into the locks it holds, and into its
            note under `waiting/` while it waits (`held_slots`, `waiting_steps`).
    """
    lock_dir.mkdir(parents=True, exist_ok=True)
    usable = [c for c in accepted if max(c.local.slots, 1) >= gpus]
    if not usable:
        raise ValueError(f"{gpus} GPUs asked of class {' or '.join(repr(c.name) for c in accepted)}, which has "
                         f"{' or '.join(str(max(c.local.slots, 1)) for c in accepted)} local slot(s)")
    started = reported = time.monotonic()
    note = lock_dir / WAITING_DIR / f"{(holder or {}).get('run_id', os.getpid())}-{(holder or {}).get('step_key', '')}.json"
    try:
        while True:
            for gpu_class in usable:
                held = _try_slots(gpu_class, lock_dir, gpus, holder)
                if held is None:
                    continue
                note.unlink(missing_ok=True)
                try:
                    devices = gpu_class.local.devices
                    yield gpu_class, [slot for slot, _ in held], (
                        [devices[slot % len(devices)] for slot, _ in held] if devices else [])
                finally:
                    _release(held)
                return
            if holder is not None and not note.exists():  # the coordinator says so on the run's page
                note.parent.mkdir(exist_ok=True)
                note.write_text(json.dumps({**holder, "gpus": gpus, "since": time.time() - (time.monotonic() - started),
                                            "classes": [c.name for c in usable]}))
            if time.monotonic() - reported >= report_every:
                reported = time.monotonic()
                on_wait(f"{gpus} local slot(s) of GPU class {' or '.join(repr(c.name) for c in usable)} needed, not "
                        f"free: held by other steps on this machine (pid {os.getpid()} waited "
                        f"{reported - started:.0f}s so far)")
            time.sleep(poll_seconds)
    finally:
        note.unlink(missing_ok=True)


def _try_slots(gpu_class: GpuClass, lock_dir: Path, gpus: int,
               holder: Mapping[str, str] | None = None) -> list[tuple[int, Any]] | None:
    """The `gpus` lowest free slots of the class, locked (and marked with `holder`); None (and
    nothing held) when fewer are free: all or none, never sitting on part of what another step needs."""
    held: list[tuple[int, Any]] = []
    for slot in range(max(gpu_class.local.slots, 1)):
        handle = open(lock_dir / f"{gpu_class.name}.{slot}.lock", "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        held.append((slot, handle))
        if len(held) == gpus:
            for _, locked in held:
                locked.truncate(0)
                locked.write(json.dumps({**(holder or {}), "pid": os.getpid(), "since": time.time()}))
                locked.flush()
            return held
    _release(held)
    return None


def held_slots(lock_dir: Path, classes: Iterable[GpuClass]) -> dict[str, list[dict[str, Any]]]:
    """Who holds each class's local slots now: per class, the record of each held slot (run_id,
    step_key, request, slot), from the lock files whose lock a process holds (/proc/locks)."""
    paths = {(c.name, slot): lock_dir / f"{c.name}.{slot}.lock" for c in classes for slot in range(c.local.slots)}
    locked = flocked(list(paths.values()))
    out: dict[str, list[dict[str, Any]]] = {}
    for (name, slot), path in paths.items():
        if path in locked:
            try:
                record = json.loads(path.read_text() or "{}")
            except (OSError, ValueError):
                record = {}  # locked a moment ago, not written yet
            out.setdefault(name, []).append({**record, "slot": slot})
    return out


def waiting_steps(lock_dir: Path) -> list[dict[str, Any]]:
    """The steps waiting inside `local_slots` for slots none of their classes has free: their
    notes (run_id, step_key, request, classes, gpus, since), first waiting first."""
    notes = []
    for path in sorted((lock_dir / WAITING_DIR).glob("*.json")):
        try:
            notes.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # written or removed this moment
    return sorted(notes, key=lambda n: n.get("since", 0.0))


def _release(held: list[tuple[int, Any]]) -> None:
    for _, handle in held:
        fcntl.flock(handle, fcntl.LOCK_UN)
        handle.close()


@dataclass(frozen=True)
class HeldSlots:
    """The local slots a step holds, their class and devices, and the directory of the slot locks."""

    gpu_class: GpuClass
    slots: tuple[int, ...]
    devices: tuple[str, ...]
    lock_dir: Path


@dataclass(frozen=True)
class StepClass:
    """The GPU class a step computes on, as far as the step knows it.

    `accepted` is what its Function accepts, first choice first (empty for a CPU step); `held`
    what it holds of them in the embedded mode. On Kubernetes the pod was given its GPUs, and when
    several classes were acceptable the scheduler chose among their pools: the capacity watcher
    saw which and tagged the run (`GOT_CLASS_TAG`), which is what `billed` reads.

    Example:
        >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
        >>> t4 = GpuClass(name="t4", gpu_model="T4", gpu_memory="16GiB", max_gpu_count_per_worker=1)
        >>> StepClass((l4, t4), None).describe(), StepClass((l4, t4), None).gpu_class is None
        ('l4 or t4', True)
    """

    accepted: tuple[GpuClass, ...]
    held: HeldSlots | None = None

    @property
    def gpu_class(self) -> GpuClass | None:
        """The class it got: the one whose slots it holds, or its only class (None: CPU, or not known here)."""
        if self.held is not None:
            return self.held.gpu_class
        return self.accepted[0] if len(self.accepted) == 1 else None

    def describe(self) -> str:
        got = self.gpu_class
        return got.name if got is not None else " or ".join(c.name for c in self.accepted)

    def billed(self, instance: Any, run_id: str) -> GpuClass | None:
        """The class whose price the step's GPU time is billed at: the one it got, else the one the
        run's `GOT_CLASS_TAG` names (None while that is not known: no cost is claimed)."""
        if self.gpu_class is not None or not self.accepted:
            return self.gpu_class
        run = instance.get_run_by_id(run_id)
        got = (run.tags.get(GOT_CLASS_TAG, "") if run is not None else "").split(",")
        matches = [c for c in self.accepted if c.name in got]
        return matches[0] if len(matches) == 1 else None


def slot_dir(instance: Any) -> Path:
    """Where the embedded instance's slot locks (and the notes of steps waiting for them) live."""
    return Path(instance.root_directory) / "gpufn-slots"


@contextmanager
def step_slot(context: Any, accepted: tuple[GpuClass, ...], gpus: int = 1) -> Iterator[StepClass]:
    """Embedded mode: hold `gpus` local slots (and their devices) of the first of the Function's
    classes that has them free, while a GPU step runs; yields the class the step got and what it
    holds (the step's warm Function instances live there: `embedded.warm`).

    The pool let the step start; the slots say which class and devices it uses
    (CUDA_VISIBLE_DEVICES), in the step's own process. A step that got a class other than its
    first choice says so in its log and tags the run with it (`GOT_CLASS_TAG`). Outside the
    embedded coordinator (Kubernetes, `materialize`) nothing is held (the pod was given its GPUs).
    """
    if not accepted or context.run.tags.get(PLACEMENT_TAG) != RunKind.LOCAL.value:
        yield StepClass(tuple(accepted))
        return
    lock_dir = slot_dir(context.instance)
    holder = {"run_id": context.run.run_id, "step_key": context.get_step_execution_context().step.key,
              "request": choice_request([c.name for c in accepted])}
    with local_slots(tuple(accepted), lock_dir, gpus, on_wait=context.log.warning, holder=holder) as (
            gpu_class, slots, devices):
        before = os.environ.get("CUDA_VISIBLE_DEVICES")
        if devices:
            os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
        context.log.info(f"local GPU slot{'s' if len(slots) > 1 else ''} {', '.join(map(str, slots))} of class "
                         f"{gpu_class.name!r}"
                         + (f", CUDA_VISIBLE_DEVICES={','.join(devices)}" if devices else "")
                         + choice_note(accepted, gpu_class, 'had no free slot'))
        if len(accepted) > 1:
            tag_got_class(context.instance, context.run.run_id, gpu_class.name)
        try:
            yield StepClass(tuple(accepted), HeldSlots(gpu_class, tuple(slots), tuple(devices), lock_dir))
        finally:  # a run worker running its steps itself (in_process) goes on to other steps
            if before is None:
                os.environ.pop("CUDA_VISIBLE_DEVICES", None)
            else:
                os.environ["CUDA_VISIBLE_DEVICES"] = before
