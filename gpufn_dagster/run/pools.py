"""Embedded mode, pure: who waits for a class's local GPU slots, behind whom, and what to tell them.

Each GPU step claims a slot of its class's Dagster pool (`gpu-<class>`, limited to the class's
`local.slots`), so a run whose GPU step finds every slot taken is already started and its page
shows its event log. Dagster itself logs "Step blocked by limit for pool gpu-<class>"; the
coordinator's sweep (`embedded.coordinator`) reads the pools and, through these functions, adds what that
line lacks: the class, who holds its slots, the place in line, since when, and the class's
`max_wait`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..classes import GpuClass
from ..tags import class_choice

AHEAD_NAMED = 3  # the steps ahead of a waiting step that its message names; the rest are counted


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
    # of a choice of classes, each class's holders (class, ((run id, step key), ...)); () for one class
    held_by_class: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = ()

    @property
    def digest(self) -> str:
        """What a report of this wait says, as one short value: a new report only when it changes."""
        return f"{self.gpu_class}:{self.step_key}:{self.position}/{self.waiting}"


def step_waits(gpu_class: str, pending: Iterable[tuple[str, str, float, int]],
               holders: Iterable[tuple[str, str]]) -> list[StepWait]:
    """The waits of one class's pool, first in line first.

    `pending` holds (run id, step key, since, priority) of each step waiting for a slot, and
    `holders` (run id, step key) of each step holding one. Dagster hands a freed slot to the
    highest priority, then the longest waiting, so the line is ordered the same way; steps that
    began waiting in the same instant (SQLite keeps whole seconds) by run id and step key, so every
    pass and process lines them up alike.

    >>> waits = step_waits("l4", [("r2", "b", 20.0, 0), ("r1", "a", 10.0, 0), ("r3", "c", 30.0, 5)], [("r0", "x")])
    >>> [(w.run_id, w.position, w.waiting, w.digest) for w in waits]
    [('r3', 1, 3, 'l4:c:1/3'), ('r1', 2, 3, 'l4:a:2/3'), ('r2', 3, 3, 'l4:b:3/3')]
    """
    line = sorted(pending, key=lambda p: (-p[3], p[2], p[0], p[1]))
    held = tuple(holders)
    return [StepWait(run_id, step_key, gpu_class, since, i, len(line), held)
            for i, (run_id, step_key, since, _) in enumerate(line, start=1)]


def lines_of(waits: Iterable[StepWait]) -> dict[str, list[StepWait]]:
    """Each class's (or choice's) waits, first in line first: sorted once per pass, so naming who is
    ahead of each of 10,000 waiting steps costs a few steps each, not the whole line.

    >>> lines = lines_of(step_waits("l4", [("r2", "b", 20.0, 0), ("r1", "a", 10.0, 0)], []))
    >>> [(w.run_id, w.position) for w in lines["l4"]]
    [('r1', 1), ('r2', 2)]
    """
    lines: dict[str, list[StepWait]] = {}
    for wait in sorted(waits, key=lambda w: w.position):
        lines.setdefault(wait.gpu_class, []).append(wait)
    return lines


def named_ahead(line: Sequence[StepWait], wait: StepWait) -> list[StepWait]:
    """The first AHEAD_NAMED steps ahead of `wait` in its class's `line` (`lines_of`): those a wait's
    message names; the others are counted.

    >>> line = lines_of(step_waits("l4", [(f"r{i}", "s", float(i), 0) for i in range(6)], []))["l4"]
    >>> [w.run_id for w in named_ahead(line, line[4])], named_ahead(line, line[0])
    (['r0', 'r1', 'r2'], [])
    """
    ahead = []
    for other in line:
        if other.position >= wait.position or len(ahead) == AHEAD_NAMED:
            break
        ahead.append(other)
    return ahead


def wait_message(wait: StepWait, gpu_class: GpuClass, ahead: list[StepWait]) -> str:
    """The run page's line for a step that waits: the class (every class of a choice, and who holds
    each), why, who is ahead (`ahead`: the first few, `named_ahead`; the others counted), and how
    long it may wait.

    >>> from gpufn_dagster.classes import GpuClass
    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, max_wait="1h")
    >>> w = step_waits("l4", [("r1", "docs__embedding", 0.0, 0)], [("abcdef123", "docs__summary")])[0]
    >>> print(wait_message(w, l4, []))
    Step docs__embedding waits for a local GPU slot of class 'l4': all 1 slot(s) in use (run abcdef12 step docs__summary); first in line, 1 step(s) of the class waiting. It starts as soon as a slot frees. It gives up after max_wait 3600s.
    >>> choice = note_waits([{"run_id": "r9", "step_key": "e", "request": "l4|t4"}],
    ...                     {"l4": [{"run_id": "abcdef123", "step_key": "s"}], "t4": [{"run_id": "0123456789", "step_key": "t"}]})[0]
    >>> t4 = GpuClass(name="t4", gpu_model="T4", gpu_memory="16GiB", max_gpu_count_per_worker=1)
    >>> from gpufn_dagster.class_requests import choice_view
    >>> print(wait_message(choice, choice_view((l4, t4)), []))
    Step e waits for a local GPU slot of class 'l4|t4' (l4, else t4): l4: all slot(s) in use (run abcdef12 step s); t4: all slot(s) in use (run 01234567 step t); first in line, 1 step(s) of the choice waiting. It starts as soon as a slot of either frees. It gives up after max_wait 3600s.
    """
    more = wait.position - 1 - len(ahead)
    line = ("first in line" if wait.position == 1 else
            f"position {wait.position}, behind " + ", ".join(f"run {w.run_id[:8]} step {w.step_key}" for w in ahead)
            + (f" and {more} more" if more > 0 else ""))
    limit = (f" It gives up after max_wait {gpu_class.max_wait.total_seconds():.0f}s."
             if gpu_class.max_wait is not None else "")
    if wait.held_by_class:
        classes = [name for name, _ in wait.held_by_class]
        held = "; ".join(f"{name}: all slot(s) in use ("
                         + (", ".join(f"run {run[:8]} step {step}" for run, step in holders) or "being handed over")
                         + ")" for name, holders in wait.held_by_class)
        return (f"Step {wait.step_key} waits for a local GPU slot of class {gpu_class.name!r} "
                f"({', else '.join(classes)}): {held}; {line}, {wait.waiting} step(s) of the choice waiting. "
                f"It starts as soon as a slot of either frees.{limit}")
    holders = ", ".join(f"run {run[:8]} step {step}" for run, step in wait.holders) or "being handed over"
    return (f"Step {wait.step_key} waits for a local GPU slot of class {gpu_class.name!r}: all "
            f"{gpu_class.local.slots} slot(s) in use ({holders}); {line}, {wait.waiting} step(s) of the class "
            f"waiting. It starts as soon as a slot frees.{limit}")


def pool_limits_now(pooled: Mapping[str, GpuClass], held: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, int]:
    """Each pool's limit for this pass, one count for a class's slots whichever pool they are
    claimed through: the steps of the pool that hold slots now, plus the free slots of its classes.
    `pooled`: the classes and the choices of them (`embedded.coordinator.pooled_classes`); `held`: per class,
    who holds its slots (`embedded.slots.held_slots`: each record's `request` is the pool it claimed).

    A choice whose classes are all held by single-class steps admits no step (its steps wait in
    Dagster's pool, said as any wait); a single-class step holding a slot leaves its choices one fewer.

    >>> a, b = (GpuClass(name=n, gpu_model="X", gpu_memory="8GiB", max_gpu_count_per_worker=1, local={"slots": 1})
    ...         for n in ("a", "b"))
    >>> from gpufn_dagster.class_requests import choice_view
    >>> pooled = {"a": a, "b": b, "a|b": choice_view((a, b))}
    >>> pool_limits_now(pooled, {})
    {'a': 1, 'b': 1, 'a|b': 2}
    >>> pool_limits_now(pooled, {"a": [{"request": "a", "run_id": "r1", "step_key": "s"}],
    ...                          "b": [{"request": "b", "run_id": "r2", "step_key": "s"}]})
    {'a': 1, 'b': 1, 'a|b': 0}
    >>> pool_limits_now(pooled, {"a": [{"request": "a|b", "run_id": "r3", "step_key": "s"}]})
    {'a': 0, 'b': 1, 'a|b': 2}
    """
    free = {name: max(c.local.slots - len(held.get(name, ())), 0) for name, c in pooled.items()
            if len(class_choice(name)) == 1}
    limits = {}
    for name in pooled:
        classes = class_choice(name)
        own = {(r.get("run_id"), r.get("step_key")) for c in classes for r in held.get(c, ()) if r.get("request") == name}
        limits[name] = len(own) + sum(free.get(c, 0) for c in classes)
    return limits


def with_holders(wait: StepWait, held: Mapping[str, Sequence[Mapping[str, Any]]]) -> StepWait:
    """A wait in a choice's pool, with who holds each of its classes' slots (what its line names);
    a class's own wait as it is (its pool's holders are its slots' holders).

    >>> w = step_waits("a|b", [("r9", "e", 5.0, 0)], [])[0]
    >>> with_holders(w, {"b": [{"run_id": "r2", "step_key": "s"}]}).held_by_class
    (('a', ()), ('b', (('r2', 's'),)))
    """
    classes = class_choice(wait.gpu_class)
    if len(classes) < 2:
        return wait
    held_by = tuple((c, tuple((r.get("run_id", "?"), r.get("step_key", "?")) for r in held.get(c, ()))) for c in classes)
    return dataclasses.replace(wait, holders=tuple(h for _, hs in held_by for h in hs), held_by_class=held_by)


def note_waits(notes: Sequence[Mapping[str, Any]], held: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[StepWait]:
    """The waits of steps that hold their pool's slot but not yet their classes' slots (their notes,
    `embedded.slots.waiting_steps`, first waiting first): a choice whose classes another pool's steps hold,
    or a step of several GPUs fewer of which are free. Their line is per request, by when they began.

    >>> waits = note_waits([{"run_id": "r9", "step_key": "e", "request": "a|b", "since": 5.0}],
    ...                    {"a": [{"run_id": "r1", "step_key": "s", "request": "a"}]})
    >>> [(w.gpu_class, w.position, w.waiting, w.holders, w.held_by_class) for w in waits]
    [('a|b', 1, 1, (('r1', 's'),), (('a', (('r1', 's'),)), ('b', ())))]
    """
    by_request: dict[str, list[Mapping[str, Any]]] = {}
    for note in notes:
        by_request.setdefault(note.get("request", ""), []).append(note)
    waits = []
    for request, line in by_request.items():
        holders = tuple((r.get("run_id", "?"), r.get("step_key", "?"))
                        for c in (class_choice(request) if request else ()) for r in held.get(c, ()))
        for i, note in enumerate(sorted(line, key=lambda n: n.get("since", 0.0)), start=1):
            waits.append(with_holders(StepWait(note["run_id"], note["step_key"], request, note.get("since", 0.0), i,
                                               len(line), holders), held))
    return waits
