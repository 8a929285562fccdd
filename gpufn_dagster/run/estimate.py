"""How long a waiting GPU run will wait, roughly: pure, from what the instance already knows.

Kueue and the Kubernetes scheduler say *that* a run waits and behind whom, never for how long.
The estimate replays the class's queue on its capacity: the GPUs of the class (nodes x GPUs on
Kubernetes, local slots in the embedded mode) free up as the runs holding them reach their
typical duration, and the runs ahead take them in order, each for its own typical duration. A
run's typical duration is the median of the recent successful runs of the same work (its asset
selection, else its job) in the instance's history; for a selection never run as such (one asset
after a Materialize all that had it among others), the sum of its assets' own typical times, each
the median of its step's recent successful runs in any selection. When a run ahead, or one
holding GPUs, has no history either way, the estimate is "unknown" rather than a guess; when the
runs holding the GPUs it needs are past their typical time, it is "any moment", never "now".

>>> history = {"docs__embedding": [480.0, 500.0, 460.0]}
>>> e = estimate_wait(QueueState("a100-80gb", capacity=2, holding=[Holder("docs__embedding", 2, 100.0)],
...                              ahead=[Ahead("docs__embedding", 2)] * 3, gpus=2), history)
>>> e.seconds, e.text
(1820.0, 'about 30 min (3 runs ahead on a100-80gb, typical 8 min each, 2 GPUs in the class)')
"""

from __future__ import annotations

import heapq
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

HISTORY_RUNS = 20  # the most recent successful runs per kind of work that a typical duration uses


@dataclass(frozen=True)
class Holder:
    """A run holding `gpus` GPUs of the class, doing `work` (made of the assets `parts`), for
    `elapsed` seconds so far."""

    work: str
    gpus: int
    elapsed: float
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class Ahead:
    """A run waiting ahead in line, doing `work` (made of the assets `parts`), for `gpus` GPUs."""

    work: str
    gpus: int
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class QueueState:
    """One waiting run's view of its class: capacity in GPUs, who holds them, who is ahead, its own request."""

    gpu_class: str
    capacity: int
    holding: Sequence[Holder] = field(default_factory=tuple)
    ahead: Sequence[Ahead] = field(default_factory=tuple)
    gpus: int = 1


@dataclass(frozen=True)
class Estimate:
    """Seconds until the run should start (None: unknown) and the sentence the run shows."""

    seconds: float | None
    text: str

    @property
    def tag(self) -> str:
        """The tag value: the short form ("about 30 min", "under a minute", "any moment", "now", "unknown")."""
        return self.text.split(" (")[0]


def typical(durations: Sequence[float]) -> float | None:
    """The typical duration of a kind of work: the median of its recent runs (None without any)."""
    return statistics.median(durations) if durations else None


def typical_of(run: Holder | Ahead, history: Mapping[str, Sequence[float]]) -> float | None:
    """A run's typical time on the GPUs: that of its work when the instance ran the same work
    before, else the sum of its parts' (each asset's own history), None when one has none.

    >>> history = {"a, b": [300.0], "a": [100.0, 120.0], "b": [40.0]}
    >>> typical_of(Ahead("a, b", 1, ("a", "b")), history), typical_of(Ahead("a", 1, ("a",)), history)
    (300.0, 110.0)
    >>> typical_of(Ahead("b, c", 1, ("b", "c")), history), typical_of(Ahead("c", 1, ("c",)), history)
    (None, None)
    """
    own = typical(history.get(run.work, ()))
    if own is not None or not run.parts:
        return own
    parts = [typical(history.get(part, ())) for part in run.parts]
    return None if None in parts else sum(parts)


def _unknown_parts(run: Holder | Ahead, history: Mapping[str, Sequence[float]]) -> list[str]:
    """What has no history when a run's typical time is unknown: its parts without any, or its work."""
    return [p for p in run.parts if not history.get(p)] or [run.work]


def _minutes(seconds: float) -> str:
    """A rounded duration a person reads: "under a minute", "8 min", "2 h 12 min".

    >>> _minutes(20), _minutes(480), _minutes(7900)
    ('under a minute', '8 min', '2 h 12 min')
    """
    if seconds < 60:
        return "under a minute"
    minutes = round(seconds / 60)
    return f"{minutes} min" if minutes < 120 else f"{minutes // 60} h {minutes % 60} min"


def waited_tag(seconds: float) -> str:
    """The wait-estimate tag of a run that got its GPUs: how long it actually waited.

    >>> waited_tag(20), waited_tag(98)
    ('waited under a minute', 'waited 2 min')
    """
    return f"waited {_minutes(seconds)}"


def estimate_wait(state: QueueState, history: Mapping[str, Sequence[float]]) -> Estimate:
    """When the waiting run should start: the class's GPUs replayed over the runs that hold them and
    the runs ahead, each for its typical duration (`history`: work -> recent durations in seconds).
    A run needing N GPUs starts when N of them are free at once."""
    line = [*state.ahead, Ahead("", state.gpus)]  # its own work does not matter to its start
    return estimate_line(state.gpu_class, state.capacity, state.holding, line, history)[-1]


def estimate_line(gpu_class: str, capacity: int, holding: Sequence[Holder], line: Sequence[Ahead],
                  history: Mapping[str, Sequence[float]]) -> list[Estimate]:
    """The estimate of every run of a class's line (first in line first) in one pass: each takes the
    GPUs as they free, so a line of n runs costs n heap operations, not n^2."""
    detail_of = _details(gpu_class, capacity, line, history)
    if capacity < 1:
        return [Estimate(None, f"unknown ({detail_of(i)}; no GPU of the class is known here)") for i in range(len(line))]
    unknown = sorted({p for h in holding if typical_of(h, history) is None for p in _unknown_parts(h, history)})
    free = [(0.0, False)] * capacity  # per GPU: (when it frees, seconds from now; whether a run holds it)
    held = 0
    for holder in holding:
        left = max((typical_of(holder, history) or 0.0) - holder.elapsed, 0.0)
        for _ in range(min(holder.gpus, capacity - held)):
            free[held] = (left, True)
            held += 1
    heapq.heapify(free)
    estimates = []
    for index, run in enumerate(line):
        if unknown:
            estimates.append(Estimate(None, f"unknown ({detail_of(index)}; no finished run of "
                                            f"{', '.join(unknown[:3])} in this instance's history)"))
        taken = [heapq.heappop(free) for _ in range(min(run.gpus, capacity))]
        start = max(at for at, _ in taken)
        seconds = typical_of(run, history)
        for _ in taken:
            heapq.heappush(free, (start + (seconds or 0.0), True))
        if not unknown:
            estimates.append(_estimate(start, any(holder for _, holder in taken), detail_of(index)))
        if seconds is None:  # nobody behind it can be estimated
            unknown.extend(p for p in _unknown_parts(run, history) if p not in unknown)
    return estimates


def _estimate(start: float, held: bool, detail: str) -> Estimate:
    """A known estimate: starting in `start` seconds, on GPUs some run holds until then (`held`).
    A start due already on held GPUs is "any moment": their holders are past their typical time,
    and the run still waits for them to end.

    >>> _estimate(0.0, False, "0 runs ahead").text, _estimate(0.0, True, "0 runs ahead").tag
    ('now (0 runs ahead)', 'any moment')
    """
    if start > 0:
        return Estimate(start, f"{'about ' if start >= 60 else ''}{_minutes(start)} ({detail})")
    if held:
        return Estimate(0.0, f"any moment ({detail}; the runs holding its GPUs are past their typical time)")
    return Estimate(0.0, f"now ({detail})")


def _details(gpu_class: str, capacity: int, line: Sequence[Ahead],
             history: Mapping[str, Sequence[float]]) -> Callable[[int], str]:
    """The "3 runs ahead on X, typical 8 min each, 2 GPUs in the class" part for a place in line
    (typical: the mean of the typical durations ahead, from prefix sums, so each place costs O(1))."""
    sums, known = [0.0], [0]
    for run in line:
        seconds = typical_of(run, history)
        sums.append(sums[-1] + (seconds or 0.0))
        known.append(known[-1] + (seconds is not None))
    gpus = f"{capacity} GPU{'s' if capacity != 1 else ''} in the class"

    def detail(index: int) -> str:
        runs = f"{index} run{'s' if index != 1 else ''} ahead on {gpu_class}"
        if capacity < 1 or known[index] < index:
            return runs
        each = f", typical {_minutes(sums[index] / index)} each" if index else ""
        return f"{runs}{each}, {gpus}"
    return detail


def changed_meaningfully(previous: str | None, new: Estimate) -> bool:
    """Whether a run's estimate moved enough to say so again: known <-> unknown, or its rounded
    minutes moved by a quarter or more (and at least two minutes), so a slowly ticking estimate
    is not re-reported on every pass.

    >>> e = Estimate(1800.0, "about 30 min (...)")
    >>> changed_meaningfully(None, e), changed_meaningfully("about 30 min", e), changed_meaningfully("about 26 min", e)
    (True, False, False)
    >>> changed_meaningfully("about 60 min", e), changed_meaningfully("unknown", e)
    (True, True)
    """
    if previous is None or previous == new.tag:
        return previous is None
    old_minutes = _tag_minutes(previous)
    new_minutes = _tag_minutes(new.tag)
    if old_minutes is None or new_minutes is None:
        return True
    return abs(new_minutes - old_minutes) >= max(2.0, 0.25 * max(old_minutes, new_minutes))


def _tag_minutes(tag: str) -> float | None:
    """The minutes an estimate's tag names (None for "unknown")."""
    if tag.startswith(("now", "any moment")) or "under a minute" in tag:
        return 0.0
    words = tag.replace("about ", "").split()
    try:
        if "h" in words:
            return int(words[0]) * 60 + (int(words[2]) if len(words) > 2 else 0)
        return float(words[0])
    except (ValueError, IndexError):
        return None
