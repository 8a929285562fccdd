"""Embedded mode, pure: who waits for a class's local GPU slots, behind whom, and what to tell them.

Each GPU step claims a slot of its class's Dagster pool (`gpu-<class>`, limited to the class's
`local.slots`), so a run whose GPU step finds every slot taken is already started and its page
shows its event log. Dagster itself logs "Step blocked by limit for pool gpu-<class>"; the
coordinator's sweep (`run.local`) reads the pools and, through these functions, adds what that
line lacks: the class, who holds its slots, the place in line, since when, and the class's
`max_wait`.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from ..classes import GpuClass


@dataclass(frozen=True)
class StepWait:
    """One GPU step waiting for a local slot of its class."""

    run_id: str
    step_key: str
    gpu_class: str
    since: float                      # when it started waiting (seconds since the epoch)
    position: int                     # 1 = next to get a slot
    waiting: int                      # how many steps of the class wait in all
    holders: tuple[tuple[str, str], ...]  # (run id, step key) of each step holding a slot now

    @property
    def digest(self) -> str:
        """What a report of this wait says, as one short value: a new report only when it changes."""
        return f"{self.gpu_class}:{self.step_key}:{self.position}/{self.waiting}"


def step_waits(gpu_class: str, pending: Iterable[tuple[str, str, float, int]],
               holders: Iterable[tuple[str, str]]) -> list[StepWait]:
    """The waits of one class's pool, first in line first.

    `pending` holds (run id, step key, since, priority) of each step waiting for a slot, and
    `holders` (run id, step key) of each step holding one. Dagster hands a freed slot to the
    highest priority, then the longest waiting, so the line is ordered the same way.

    >>> waits = step_waits("l4", [("r2", "b", 20.0, 0), ("r1", "a", 10.0, 0), ("r3", "c", 30.0, 5)], [("r0", "x")])
    >>> [(w.run_id, w.position, w.waiting, w.digest) for w in waits]
    [('r3', 1, 3, 'l4:c:1/3'), ('r1', 2, 3, 'l4:a:2/3'), ('r2', 3, 3, 'l4:b:3/3')]
    """
    line = sorted(pending, key=lambda p: (-p[3], p[2]))
    held = tuple(holders)
    return [StepWait(run_id, step_key, gpu_class, since, i, len(line), held)
            for i, (run_id, step_key, since, _) in enumerate(line, start=1)]


def wait_message(wait: StepWait, gpu_class: GpuClass, ahead: list[StepWait]) -> str:
    """The run page's line for a step that waits: the class, why, who is ahead, and how long it may wait.

    >>> from gpufn_dagster.classes import GpuClass
    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, max_wait="1h")
    >>> w = step_waits("l4", [("r1", "docs__embedding", 0.0, 0)], [("abcdef123", "docs__summary")])[0]
    >>> print(wait_message(w, l4, []))
    Step docs__embedding waits for a local GPU slot of class 'l4': all 1 slot(s) in use (run abcdef12 step docs__summary); first in line, 1 step(s) of the class waiting. It starts as soon as a slot frees. It gives up after max_wait 3600s.
    """
    holders = ", ".join(f"run {run[:8]} step {step}" for run, step in wait.holders) or "being handed over"
    line = ("first in line" if wait.position == 1 else
            f"position {wait.position}, behind " + ", ".join(f"run {w.run_id[:8]} step {w.step_key}" for w in ahead))
    limit = (f" It gives up after max_wait {gpu_class.max_wait.total_seconds():.0f}s."
             if gpu_class.max_wait is not None else "")
    return (f"Step {wait.step_key} waits for a local GPU slot of class {gpu_class.name!r}: all "
            f"{gpu_class.local.slots} slot(s) in use ({holders}); {line}, {wait.waiting} step(s) of the class "
            f"waiting. It starts as soon as a slot frees.{limit}")
