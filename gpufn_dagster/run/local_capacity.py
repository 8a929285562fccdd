"""The embedded mode's capacity decisions, beside the pods' (`capacity`): a run's placement on local
slots, and its GPU steps' slot waits -> the tags, events and end to record. Pure: no instance, no
clock; the coordinator (`embedded.coordinator`) observes Dagster's pools and the slot locks, asks
here, and applies each `Decision` as it is, as the Kubernetes watcher applies `capacity.decide`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from ..classes import GpuClass
from ..tags import (CAPACITY_REASON_TAG, CAPACITY_REPORTED_TAG, CAPACITY_TAG, GPU_CLASS_TAG, HOLDING_SINCE_TAG,
                    PLACEMENT_REJECTED, PLACEMENT_TAG, RUN_GPU_COUNT_TAG, WAIT_ESTIMATE_TAG, WAITING_SINCE_TAG,
                    CapacityReason, CapacityState, RunKind, time_tag, waiting_since)
from .capacity import Decision, Event, past_max_wait, place_moved
from .estimate import waited_tag
from .placement import Placement
from .pools import StepWait, named_ahead, wait_message


def decide_local_placement(placements: Mapping[str, Placement]) -> Decision:
    """A GPU run's tags on local slots (its classes and counts), or its end now when a step can never
    get its slots here: a class with `local.slots: 0`, or more GPUs than its slots (a slot is one GPU).

    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=4, local={"slots": 1})
    >>> decide_local_placement({"l4": Placement(l4, 1)}).tags
    {'gpufn/gpu-class': 'l4', '.dagster/gpufn-gpu-count': '1', 'gpufn/placement': 'local'}
    >>> never = decide_local_placement({"l4": Placement(l4, 2)})
    >>> never.state.value, never.fail.split(":")[0]
    ('never-fits', 'This run can never start here')
    """
    names = sorted(placements)
    tags = {GPU_CLASS_TAG: ",".join(names), RUN_GPU_COUNT_TAG: ",".join(str(placements[n].gpu_count) for n in names),
            PLACEMENT_TAG: RunKind.LOCAL.value}
    slots = {name: [c.local.slots for c in placements[name].accepted] for name in names}
    empty = [name for name in names if not any(slots[name])]
    too_big = [name for name in names if placements[name].gpu_count > max(slots[name])]
    if not (empty or too_big):
        return Decision(tags=tags)
    name = (empty or too_big)[0]
    return Decision(
        CapacityState.NEVER_FITS,
        {**tags, PLACEMENT_TAG: PLACEMENT_REJECTED, CAPACITY_TAG: CapacityState.NEVER_FITS.value,
         CAPACITY_REASON_TAG: CapacityReason.NEVER_FITS.value},
        fail=(f"GPU class {name!r} has local.slots: 0, so no step of it can run on this machine (embedded mode); "
              "give it slots in its class file, or run it on Kubernetes" if empty else
              f"This run can never start here: a step asks for {placements[name].gpu_count} GPUs of class {name!r}, "
              f"whose local.slots is {max(slots[name])} (a slot is one GPU); give the class more slots in its file, "
              "ask for fewer GPUs, or run it on Kubernetes"))


def _holders(holders: Sequence[tuple[str, str]]) -> str:
    return ", ".join(f"{run[:8]}/{step}" for run, step in holders) or "-"


def told_already(reported: str | None, run_waits: Sequence[StepWait]) -> bool:
    """Whether a run's step waits were told already, close enough: the same steps on the same
    classes, none of whose places moved (`capacity.place_moved`: any move among the first places, a
    tenth of the place beyond) since the report whose digest is `reported`. Steps joining the line
    behind do not move a place: a step first in line is not told again that the line grew.

    >>> w = StepWait("r", "emb", "l4", since=0.0, position=2, waiting=3, holders=())
    >>> told_already(None, [w]), told_already("l4:emb:2/3", [w]), told_already("l4:emb:3/3", [w])
    (False, True, False)
    >>> told_already("l4:emb:2/2", [w])
    True
    >>> far = StepWait("r", "emb", "l4", since=0.0, position=4800, waiting=9000, holders=())
    >>> told_already("l4:emb:5000/9000", [far]), told_already("l4:emb:5400/9000", [far])
    (True, False)
    """
    if not reported:
        return False
    before = {}
    for part in reported.split(";"):
        key, _, place = part.rpartition(":")
        before[key] = place.split("/")[0]
    now = {f"{w.gpu_class}:{w.step_key}": w for w in run_waits}
    return set(before) == set(now) and not any(place_moved(f"{before[key]} of {w.waiting}", (w.position, w.waiting))
                                               for key, w in now.items())


def decide_slots(run_waits: Sequence[StepWait], lines: Mapping[str, Sequence[StepWait]], classes: Mapping[str, GpuClass],
                 previous: Mapping[str, str], now: float, holding: bool) -> Decision:
    """What to record for a started GPU run from its steps' slot waits (`run_waits`; `lines`: every
    class's waits, first in line first, `pools.lines_of`), given its tags from earlier passes;
    `holding`: its GPU steps hold slots now.

    A step waiting past its class's max_wait ends the run (`fail`: the coordinator terminates it,
    as the watcher deletes a pod's Job); a wait told already is not said again (`told_already`:
    its digest is a tag); a new one is said in each waiting step's log. A run is `running` once its
    steps hold their slots, not when Dagster's pool admits them; one that waited hears how long.

    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, max_wait="10m")
    >>> w = StepWait("run1", "docs__emb", "l4", since=1796058000.0, position=1, waiting=1, holders=(("run0", "s"),))
    >>> first = decide_slots([w], {"l4": [w]}, {"l4": l4}, {}, 1796058073, holding=False)
    >>> first.tags["gpufn/capacity"], [e.step_key for e in first.step_events]
    ('waiting', ['docs__emb'])
    >>> decide_slots([w], {"l4": [w]}, {"l4": l4}, first.tags, 1796058100, holding=False).tags   # nothing new to say
    {}
    >>> decide_slots([w], {"l4": [w]}, {"l4": l4}, first.tags, 1796058000 + 601, holding=False).fail.split(" (")[0]
    "Gave up waiting for a local GPU slot of class 'l4' after 601s"
    >>> got = decide_slots([], {}, {"l4": l4}, first.tags, 1796058133, holding=True)
    >>> got.tags["gpufn/capacity"], got.event.metadata
    ('running', {'Waited seconds': 133.0})
    """
    if run_waits:
        for wait in run_waits:
            gpu_class, waited = classes[wait.gpu_class], now - wait.since
            if past_max_wait(gpu_class, waited):
                message = (f"Gave up waiting for a local GPU slot of class {gpu_class.name!r} after {waited:.0f}s "
                           f"(max_wait {gpu_class.max_wait.total_seconds():.0f}s): all {gpu_class.local.slots} "
                           "slot(s) stayed in use. Terminating the run.")
                return Decision(
                    CapacityState.TIMED_OUT,
                    {CAPACITY_TAG: CapacityState.TIMED_OUT.value, CAPACITY_REASON_TAG: CapacityReason.MAX_WAIT_EXCEEDED.value},
                    fail=message, waited_seconds=waited,
                    step_events=(Event(message, {"GPU class": gpu_class.name, "Waited seconds": round(waited, 1),
                                                 "max_wait seconds": gpu_class.max_wait.total_seconds(),
                                                 "Capacity reason": CapacityReason.MAX_WAIT_EXCEEDED.value},
                                       step_key=wait.step_key),))
        since = min(w.since for w in run_waits)
        digest = ";".join(w.digest for w in run_waits)
        if told_already(previous.get(CAPACITY_REPORTED_TAG), run_waits):
            return Decision(CapacityState.WAITING, waited_seconds=now - since)
        events = []
        for wait in run_waits:
            gpu_class = classes[wait.gpu_class]
            ahead = named_ahead(lines.get(wait.gpu_class, ()), wait)
            events.append(Event(wait_message(wait, gpu_class, ahead), {
                "GPU class": gpu_class.name, "Local slots": gpu_class.local.slots,
                "Position": f"{wait.position} of {wait.waiting}", "Waiting since": time_tag(wait.since),
                "Slots held by": _holders(wait.holders),
                **{f"Class {name} held by": _holders(holders) for name, holders in wait.held_by_class}},
                step_key=wait.step_key))
        return Decision(CapacityState.WAITING,
                        {CAPACITY_TAG: CapacityState.WAITING.value,
                         CAPACITY_REASON_TAG: CapacityReason.LOCAL_SLOTS_IN_USE.value,
                         WAITING_SINCE_TAG: time_tag(since), CAPACITY_REPORTED_TAG: digest},
                        waited_seconds=now - since, step_events=tuple(events))
    running = {CAPACITY_TAG: CapacityState.RUNNING.value, CAPACITY_REASON_TAG: CapacityReason.SLOT_ACQUIRED.value,
               HOLDING_SINCE_TAG: time_tag(now)}
    if previous.get(CAPACITY_TAG) == CapacityState.WAITING.value:
        seconds = now - waiting_since(previous, now)
        return Decision(CapacityState.RUNNING,
                        {**running, **({WAIT_ESTIMATE_TAG: waited_tag(seconds)} if WAIT_ESTIMATE_TAG in previous else {})},
                        Event(f"Its GPU steps got their local GPU slots after waiting {seconds:.0f}s",
                              {"Waited seconds": round(seconds, 1)}))
    if holding and CAPACITY_TAG not in previous:  # got its slots without waiting
        return Decision(CapacityState.RUNNING, running)
    return Decision()
