"""Pod status -> capacity verdict -> what to record. Pure: no API calls, no clock reads.

A GPU run worker's pod is *waiting for capacity* when the scheduler reports it Unschedulable
for want of room (Insufficient <resource>, too many pods, node affinity/taint mismatches on the
other pools) and a node of its class could hold it once free. It *never fits* when no node of
the class could hold the request even empty. A pod held by scheduling gates, or failing for a
reason that is not scheduling (image pull, crash), is reported as what it is -- never as a wait.

`decide` turns a verdict, the run's tags from the last tick and the time into a `Decision`: the
tags to write, the event to report, and whether to fail the run (deleting its Job) -- final, for
every case: a run pod's, a step pod's (naming the steps that wait), a Kueue Workload's (with its
state tag), a run without a pod (`decide_without_pod`) and a Workload Kueue admitted
(`decide_admitted`). The watcher observes, asks, and applies decisions as they are, so every rule
of what a run shows is here, testable without Kubernetes or Dagster.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..classes import GpuClass
from ..device_cel import DeviceCount, device_class_selectors, matching_devices
from ..k8s_syntax import parse_quantity
from ..tags import (CAPACITY_REASON_TAG, CAPACITY_REPORTED_TAG, CAPACITY_TAG, CONTAINER_FAILING, HOLDING_SINCE_TAG,
                    KUEUE_TAG, POSITION_SAID_TAG, QUEUE_POSITION_TAG, WAIT_ESTIMATE_TAG, WAITING_SINCE_TAG, CapacityReason,
                    CapacityState, KueueState, seconds_from_tag, time_tag, waiting_since)
from . import kueue
from .estimate import waited_tag

_SCHEDULER_MESSAGE = re.compile(r"^0/(?P<nodes>\d+) nodes are available: (?P<reasons>.*?)(?:\.\s|\.$|$)", re.S)
_REASON = re.compile(r"^(?P<count>\d+) (?P<reason>.+)$", re.S)
AUTOSCALER_REASONS = {"TriggeredScaleUp", "NotTriggerScaleUp", "Nominated", "ScaleUpTimedOut"}
POSITION_EVERY = 60.0  # seconds: the most often a waiting run's page is told its place in line moved
# A place in line is recorded on every move among the first POSITION_ALWAYS places, and beyond them
# when it moved by POSITION_STEP of itself: 10,000 runs in line would otherwise be 10,000 writes
# each time the first one starts; this way a run's place is rewritten O(log n) times as the line drains.
POSITION_ALWAYS = 100
POSITION_STEP = 0.1
_KUEUE_REASONS = {CapacityReason.KUEUE_PENDING.value, CapacityReason.KUEUE_PREEMPTED.value,
                  CapacityReason.KUEUE_EVICTED.value}


@dataclass(frozen=True)
class SchedulerReasons:
    """The scheduler's `0/N nodes are available: …` message as a histogram (it sorts reasons as strings)."""

    nodes: int
    counts: Mapping[str, int]

    def summary(self) -> str:
        parts = sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))
        return "; ".join(f"{reason}: {count} of {self.nodes} nodes" for reason, count in parts)


@functools.lru_cache(maxsize=4096)  # the same few messages on every waiting pod, every tick
def parse_scheduler_message(message: str) -> SchedulerReasons | None:
    """The scheduler's message as a histogram of reasons, None when it is not of that form.

    >>> parse_scheduler_message("0/5 nodes are available: 2 Insufficient nvidia.com/gpu, 3 node(s) didn't "
    ...                         "match Pod's node affinity/selector. preemption: ...").summary()
    "node(s) didn't match Pod's node affinity/selector: 3 of 5 nodes; Insufficient nvidia.com/gpu: 2 of 5 nodes"
    """
    match = _SCHEDULER_MESSAGE.match(message.strip())
    if not match:
        return None
    counts: dict[str, int] = {}
    for part in re.split(r", (?=\d+ )", match["reasons"]):
        item = _REASON.match(part.strip())
        if item:
            reason = item["reason"].strip()
            counts[reason] = counts.get(reason, 0) + int(item["count"])
    return SchedulerReasons(nodes=int(match["nodes"]), counts=counts)


@dataclass(frozen=True)
class Verdict:
    """What a GPU run's pod is doing, as far as capacity is concerned."""

    state: CapacityState
    reason: str = ""
    message: str = ""
    node: str | None = None
    reasons: SchedulerReasons | None = None
    autoscaler: tuple[str, ...] = field(default_factory=tuple)
    source: str = "Scheduler"  # whose words `message` is: the scheduler's, or Kueue's


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, dict) or isinstance(obj, Mapping) else getattr(obj, key, None)
    return obj


def class_nodes(gpu_class: GpuClass, nodes: Iterable[Any]) -> list[Any]:
    """Nodes of the class's pool: they carry every label of its node selector."""
    selector = gpu_class.node_selector
    return [n for n in nodes if all((_get(n, "metadata", "labels") or {}).get(k) == v for k, v in selector.items())]


def dra_gpus(gpu_class: GpuClass, device_class: Mapping[str, Any] | None, slices: Iterable[Mapping[str, Any]],
             nodes: Iterable[Any]) -> DeviceCount:
    """A DRA class's GPUs per node of its pool: the devices its ResourceSlices publish that pass the
    DeviceClass's selectors and the class's (as the allocator matches them), over `count_per_gpu`.
    A DeviceClass that does not exist (`device_class` None) has no device."""
    assert gpu_class.dra is not None
    if device_class is None:
        return DeviceCount()
    pool = {_get(n, "metadata", "name") for n in class_nodes(gpu_class, nodes)}
    found = matching_devices([*device_class_selectors(device_class), *gpu_class.dra.selectors],
                             [s for s in slices if ((s.get("spec") or {}).get("nodeName") in pool)])
    per_gpu = gpu_class.dra.count_per_gpu
    return DeviceCount({node: n // per_gpu for node, n in found.by_node.items() if n >= per_gpu}, found.unsure)


def class_gpus(gpu_class: GpuClass, nodes: Iterable[Any], dra: Mapping[str, DeviceCount] | None = None) -> int:
    """How many GPUs the class's pool has in all (allocatable, over its nodes; a DRA class's from its
    ResourceSlices, `dra` by class name): its capacity for a wait estimate."""
    if gpu_class.dra is not None:
        return (dra or {}).get(gpu_class.name, DeviceCount()).total()
    return int(sum(parse_quantity((_get(n, "status", "allocatable") or {}).get(gpu_class.resource_name, "0"))
                   for n in class_nodes(gpu_class, nodes)))


def could_ever_fit(gpu_class: GpuClass, gpu_count: int, pool: Iterable[Any], dra: DeviceCount | None = None) -> bool | None:
    """Whether some node of the pool holds the request when empty; None when the pool has no node
    (an autoscaler may still add one). A DRA class's (`dra`: its GPUs per node, of every class
    accepted) when some node publishes enough matching devices; None when a device's selectors
    could not be read here and none had enough."""
    pool = list(pool)
    if not pool:
        return None
    if dra is not None:
        if dra.most_on_one_node() >= gpu_count:
            return True
        return None if dra.unsure else False
    for node in pool:
        capacity = _get(node, "status", "allocatable") or {}
        if parse_quantity(capacity.get(gpu_class.resource_name, "0")) >= gpu_count:
            return True
    return False


def pod_verdict(pod: Any, events: Iterable[Any], gpu_class: GpuClass, gpu_count: int,
                pool: Iterable[Any], dra: DeviceCount | None = None) -> Verdict:
    """What the pod of a GPU run is doing, from its status, its events and the class's nodes (a DRA
    class's: `dra`, its GPUs per node from ResourceSlices)."""
    node = _get(pod, "spec", "node_name") or _get(pod, "spec", "nodeName")
    statuses = _get(pod, "status", "container_statuses") or _get(pod, "status", "containerStatuses") or []
    for status in statuses:
        waiting = _get(status, "state", "waiting")
        if waiting and _get(waiting, "reason") in CONTAINER_FAILING:
            return Verdict(CapacityState.FAILING, _get(waiting, "reason"), _get(waiting, "message") or "", node=node)
    if node:
        return Verdict(CapacityState.SCHEDULED, node=node)
    autoscaler = tuple(sorted({_get(e, "reason") for e in events if _get(e, "reason") in AUTOSCALER_REASONS}))
    conditions = _get(pod, "status", "conditions") or []
    scheduled = next((c for c in conditions if _get(c, "type") == "PodScheduled"), None)
    gates = _get(pod, "spec", "scheduling_gates") or _get(pod, "spec", "schedulingGates")
    if gates or (scheduled is not None and _get(scheduled, "reason") == "SchedulingGated"):
        names = ", ".join(_get(g, "name") or str(g) for g in gates or [])
        return Verdict(CapacityState.GATED, CapacityReason.SCHEDULING_GATED.value, f"held by scheduling gates {names}".strip(), autoscaler=autoscaler)
    if scheduled is None or _get(scheduled, "status") != "False" or _get(scheduled, "reason") != "Unschedulable":
        return Verdict(CapacityState.PENDING, autoscaler=autoscaler)
    message = _get(scheduled, "message") or ""
    reasons = parse_scheduler_message(message)
    if could_ever_fit(gpu_class, gpu_count, pool, dra) is False:
        has = (f"publishes {gpu_class.requested_as} devices for {gpu_count} GPU(s) passing the class's selectors "
               f"in its ResourceSlices (the most on one node: {dra.most_on_one_node()})" if dra is not None else
               f"has {gpu_count} x {gpu_class.resource_name} allocatable")
        return Verdict(CapacityState.NEVER_FITS, CapacityReason.UNSCHEDULABLE.value,
                       f"no node of GPU class {gpu_class.name!r} {has} even when empty; the scheduler says: {message}",
                       reasons=reasons, autoscaler=autoscaler)
    return Verdict(CapacityState.WAITING, CapacityReason.UNSCHEDULABLE.value, message, reasons=reasons,
                   autoscaler=autoscaler)


def kueue_verdict(workload: kueue.WorkloadStatus) -> Verdict:
    """A waiting Workload as a capacity verdict: Kueue's words verbatim, and whether it was preempted.

    A request larger than the ClusterQueue's maximum capacity (its quota plus all it may borrow)
    can never be admitted: that never fits, as a class whose nodes can never hold it.
    """
    if workload.state == KueueState.PENDING and (workload.reason == kueue.EXCEEDS_MAX_QUOTA
                                                 or kueue.exceeds_maximum_capacity(workload.message)):
        return Verdict(CapacityState.NEVER_FITS, CapacityReason.NEVER_FITS.value,
                       f"ClusterQueue {workload.cluster_queue} can never admit it; Kueue says: {workload.describe()}",
                       source="Kueue")
    reason = {KueueState.PREEMPTED: CapacityReason.KUEUE_PREEMPTED, KueueState.EVICTED: CapacityReason.KUEUE_EVICTED}.get(
        workload.state, CapacityReason.KUEUE_PENDING)
    source = {KueueState.PREEMPTED: "Kueue preempted it (it waits to be admitted again; its code did not fail)",
              KueueState.EVICTED: "Kueue evicted it (it waits to be admitted again; its code did not fail)"}.get(
        workload.state, "Kueue")
    return Verdict(CapacityState.WAITING, reason.value, workload.describe(), source=source)


def past_max_wait(gpu_class: GpuClass, waited: float) -> bool:
    """Whether a run that waited `waited` seconds has waited longer than its class allows (both modes)."""
    return gpu_class.max_wait is not None and waited > gpu_class.max_wait.total_seconds()


def queue_positions(waits: Mapping[str, tuple[str, float]]) -> dict[str, tuple[int, int]]:
    """Run id -> (place, of how many) among the runs waiting on its class, the longest-waiting first.

    `waits` maps each waiting run's id to (its class, since when it waits).

    >>> queue_positions({"a": ("l4", 20.0), "b": ("l4", 10.0), "c": ("a100-80gb", 30.0)})
    {'b': (1, 2), 'a': (2, 2), 'c': (1, 1)}
    """
    queues: dict[str, list[tuple[float, str]]] = {}
    for run_id, (class_name, since) in waits.items():
        queues.setdefault(class_name, []).append((since, run_id))
    return {run_id: (i + 1, len(items)) for items in queues.values() for i, (_, run_id) in enumerate(sorted(items))}


@dataclass(frozen=True)
class Event:
    """An engine event for the run's page: a sentence, and the same facts as metadata; `step_key`
    puts it in that step's log."""

    message: str
    metadata: Mapping[str, Any] = field(default_factory=dict)
    step_key: str | None = None


@dataclass(frozen=True)
class Decision:
    """What one tick does about one run: tags to write, an event to report, and whether it fails.

    `fail` is the failure message: the run ends with it (on Kubernetes it fails and its Job and pod
    are deleted; embedded, it is terminated). `state` and `waited_seconds` feed the tick's per-class
    summary. `step_events` are said in the logs of the steps they name (a local slot wait's).
    """

    state: CapacityState | None = None
    tags: Mapping[str, str] = field(default_factory=dict)
    event: Event | None = None
    fail: str | None = None
    waited_seconds: float = 0.0
    step_events: tuple[Event, ...] = ()


def _failed(state: CapacityState, reason: CapacityReason, message: str) -> Decision:
    return Decision(state, {CAPACITY_TAG: state.value, CAPACITY_REASON_TAG: reason.value}, fail=message)


def decide(verdict: Verdict, previous: Mapping[str, str], gpu_class: GpuClass, gpu_count: int,
           position: tuple[int, int] | None, now: float, cluster_queue: str | None = None,
           ahead: Sequence[str] = (), kueue_state: str | None = None, steps: Sequence[str] = ()) -> Decision:
    """What to record for a GPU run whose pod (or Kueue Workload) got `verdict`, given its tags from
    earlier ticks: the final tags, event and failure, applied as they are.

    An unchanged wait is not reported again (its last event is remembered as a digest tag), and a
    wait past the class's `max_wait` fails the run. `position` is (place, of how many) among the
    runs waiting on the class, or in Kueue's `cluster_queue` (named in the event's metadata too), and `ahead` the runs before it
    (the first few are named); a wait that follows a run's time on a node (Kueue preempted it)
    counts from then. `kueue_state` is the state of the run's Workload when Kueue holds it (its
    tag follows it); `steps` the steps whose pods wait, for a run placed per step (the event
    names them).

    >>> from gpufn_dagster.classes import GpuClass
    >>> l4 = GpuClass(name="l4", resource_name="nvidia.com/gpu", gpu_model="L4", gpu_memory="24GiB",
    ...               max_gpu_count_per_worker=8, max_wait="10m")
    >>> wait = Verdict(CapacityState.WAITING, "Unschedulable", "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.")
    >>> first = decide(wait, {}, l4, 1, (1, 1), now=1796058073)
    >>> first.tags["gpufn/capacity"], first.tags[".dagster/gpufn-capacity-reason"], first.tags[".dagster/gpufn-waiting-since"]
    ('waiting', 'Unschedulable', '2026-11-30T17:01:13Z')
    >>> decide(wait, first.tags, l4, 1, (1, 1), now=1796058073 + 60).tags   # nothing new to say
    {}
    >>> decide(wait, first.tags, l4, 1, (1, 1), now=1796058073 + 601).fail.split(";")[0]
    "Gave up waiting for GPU capacity of class 'l4' after 601s (max_wait 600s)"
    >>> decide(wait, {}, l4, 1, None, now=1796058073, steps=["a.shard-shard_1"]).event.message[:40]
    'Step a.shard-shard_1: Waiting for GPU ca'
    """
    decision = _decide(verdict, previous, gpu_class, gpu_count, position, now, cluster_queue, ahead)
    if steps and decision.event is not None and verdict.state is CapacityState.WAITING:
        names = ", ".join(steps)
        decision = replace(decision, event=replace(decision.event, message=f"Step {names}: {decision.event.message}",
                                                   metadata={**decision.event.metadata, "Waiting steps": names}))
    if kueue_state is not None and previous.get(KUEUE_TAG) != kueue_state:
        decision = replace(decision, tags={**decision.tags, KUEUE_TAG: kueue_state})
    return decision


def decide_admitted(previous: Mapping[str, str], workload: kueue.WorkloadStatus) -> Decision | None:
    """What to record when a run's Workload is no longer waiting in Kueue: its state tag, and once
    Kueue admitted a run it had kept waiting, an event saying so (its pod's own story follows).
    None when nothing changed."""
    before = previous.get(KUEUE_TAG)
    if before == workload.state:
        return None
    event = None
    if workload.state == KueueState.ADMITTED and before is not None:
        event = Event(f"Admitted by Kueue to ClusterQueue {workload.cluster_queue}: {workload.describe()}",
                      {"ClusterQueue": workload.cluster_queue or "", "Kueue": workload.describe()})
    return Decision(tags={KUEUE_TAG: workload.state}, event=event)


def _decide(verdict: Verdict, previous: Mapping[str, str], gpu_class: GpuClass, gpu_count: int,
            position: tuple[int, int] | None, now: float, cluster_queue: str | None, ahead: Sequence[str]) -> Decision:
    previous_state = previous.get(CAPACITY_TAG)
    queue = f"in ClusterQueue {cluster_queue}" if cluster_queue else "waiting on this class"
    in_queue = {"ClusterQueue": cluster_queue} if cluster_queue else {}
    request = f"{gpu_count} x {gpu_class.requested_as}"
    if verdict.state is CapacityState.WAITING:
        since = now if previous_state == CapacityState.SCHEDULED.value else waiting_since(previous, now)
        waited = now - since
        if past_max_wait(gpu_class, waited):
            return _failed(CapacityState.TIMED_OUT, CapacityReason.MAX_WAIT_EXCEEDED,
                           f"Gave up waiting for GPU capacity of class {gpu_class.name!r} after {waited:.0f}s "
                           f"(max_wait {gpu_class.max_wait.total_seconds():.0f}s); its Job was deleted. "
                           f"Last scheduler message: {verdict.message}")
        # What is reported is the reasons, not their wording: the scheduler rewrites its message as it
        # retries (adding or dropping its "preemption: ..." part) without anything having changed.
        # Nor is the position part of it, or every wait would be re-reported whenever the queue moves.
        reasons = verdict.reasons.summary() if verdict.reasons else verdict.message
        digest = hashlib.sha1(f"{reasons}|{verdict.autoscaler}".encode()).hexdigest()[:12]
        behind = (f", behind run{'s' if len(ahead) > 1 else ''} {', '.join(r[:8] for r in ahead[:3])}"
                  f"{f' and {len(ahead) - 3} more' if len(ahead) > 3 else ''}" if ahead else "")
        place = f"position {position[0]} of {position[1]} {queue}{behind}" if position else ""
        position_tag = f"{position[0]} of {position[1]}" if position else None
        if previous.get(CAPACITY_REPORTED_TAG) == digest and previous_state == CapacityState.WAITING.value:
            return _position_moved(previous, position, place, gpu_class, now, waited, in_queue)
        autoscaler = f" Autoscaler: {', '.join(verdict.autoscaler)}." if verdict.autoscaler else ""
        reason = verdict.reason if verdict.reason in _KUEUE_REASONS else CapacityReason.UNSCHEDULABLE.value
        since_tag = time_tag(since)
        return Decision(
            CapacityState.WAITING,
            {CAPACITY_TAG: CapacityState.WAITING.value, CAPACITY_REASON_TAG: reason,
             WAITING_SINCE_TAG: since_tag, CAPACITY_REPORTED_TAG: digest,
             **({QUEUE_POSITION_TAG: position_tag, POSITION_SAID_TAG: f"{position_tag} at {time_tag(now)}"}
                if position_tag else {})},
            Event(f"Waiting for GPU capacity: class {gpu_class.name!r}, {request}, since {since_tag}"
                  f"{'; ' + place if place else ''}. {verdict.source}: {verdict.message}{autoscaler}",
                  {"GPU class": gpu_class.name, "Requested": request, "Waiting since": since_tag,
                   f"{verdict.source.split(' ')[0]} message": verdict.message,
                   "Reasons": verdict.reasons.summary() if verdict.reasons else verdict.message,
                   "Position": f"{position[0]} of {position[1]}" if position else "",
                   "Runs ahead": ", ".join(ahead[:10]), **in_queue,
                   "Autoscaler": ", ".join(verdict.autoscaler) or "no reaction"}),
            waited_seconds=waited)
    if verdict.state is CapacityState.SCHEDULED:
        if previous_state == CapacityState.SCHEDULED.value:
            return Decision(CapacityState.SCHEDULED)
        tags = {CAPACITY_TAG: CapacityState.SCHEDULED.value, CAPACITY_REASON_TAG: CapacityReason.SCHEDULED.value,
                HOLDING_SINCE_TAG: time_tag(now)}
        if previous_state != CapacityState.WAITING.value:
            return Decision(CapacityState.SCHEDULED, tags)
        waited = now - waiting_since(previous, now)
        if WAIT_ESTIMATE_TAG in previous:
            tags[WAIT_ESTIMATE_TAG] = waited_tag(waited)  # the truth replaces the estimate
        return Decision(CapacityState.SCHEDULED, tags, Event(
            f"GPU capacity arrived: scheduled on node {verdict.node} after waiting {waited:.0f}s",
            {"Node": verdict.node, "Waited seconds": round(waited, 1), "GPU class": gpu_class.name}))
    if verdict.state is CapacityState.NEVER_FITS:
        return _failed(CapacityState.NEVER_FITS, CapacityReason.NEVER_FITS, f"This run can never start: {verdict.message}")
    if verdict.state in (CapacityState.GATED, CapacityState.FAILING) and previous_state != verdict.state.value:
        what = ("held by scheduling gates (not a capacity wait)" if verdict.state is CapacityState.GATED
                else f"pod is failing to start: {verdict.reason} (not a capacity wait)")
        return Decision(verdict.state, {CAPACITY_TAG: verdict.state.value, CAPACITY_REASON_TAG: verdict.reason},
                        Event(f"GPU run {what}: {verdict.message}", {"Reason": verdict.reason}))
    return Decision(verdict.state)


def place_moved(recorded: str | None, position: tuple[int, int]) -> bool:
    """Whether a place in line differs enough from the one `recorded` ("5 of 9") to record it again:
    any change among the first POSITION_ALWAYS places; beyond them, a move by POSITION_STEP of the place.

    >>> place_moved(None, (4000, 9000)), place_moved("3 of 4", (2, 4)), place_moved("3 of 4", (3, 5))
    (True, True, True)
    >>> place_moved("5000 of 9000", (4600, 8600)), place_moved("5000 of 9000", (4400, 8400))
    (False, True)
    """
    if recorded is None:
        return True
    if recorded == f"{position[0]} of {position[1]}":
        return False
    if position[0] <= POSITION_ALWAYS:
        return True
    try:
        before = int(recorded.split(" of ")[0])
    except ValueError:
        return True
    return abs(position[0] - before) >= POSITION_STEP * max(before, position[0])


def _position_moved(previous: Mapping[str, str], position: tuple[int, int] | None, place: str, gpu_class: GpuClass,
                    now: float, waited: float, in_queue: Mapping[str, str]) -> Decision:
    """An unchanged wait whose place in line may have moved: the position tag follows the moves
    (`place_moved`: every one among the first places, a tenth of the place beyond), and the run's
    page hears a new place so recorded at most once per POSITION_EVERY seconds (the last place
    said and when are kept as `<place> at <time>`).

    >>> from gpufn_dagster.classes import GpuClass
    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1)
    >>> said = {".dagster/gpufn-queue-position": "3 of 3", ".dagster/gpufn-position-said": "3 of 3 at 2026-11-30T17:01:13Z"}
    >>> soon = _position_moved(said, (2, 3), "position 2 of 3", l4, 1796058073 + 20, 20, {})
    >>> soon.tags, soon.event
    ({'.dagster/gpufn-queue-position': '2 of 3'}, None)
    >>> later = _position_moved({**said, **soon.tags}, (2, 3), "position 2 of 3 in ClusterQueue q", l4,
    ...                         1796058073 + 90, 90, {"ClusterQueue": "q"})
    >>> later.tags[".dagster/gpufn-position-said"], later.event.message
    ('2 of 3 at 2026-11-30T17:02:43Z', "Still waiting for GPU capacity of class 'l4': now position 2 of 3 in ClusterQueue q")
    >>> later.event.metadata
    {'GPU class': 'l4', 'Position': '2 of 3', 'ClusterQueue': 'q'}
    """
    if position is None:
        return Decision(CapacityState.WAITING, waited_seconds=waited)
    text = f"{position[0]} of {position[1]}"
    tags = {QUEUE_POSITION_TAG: text} if place_moved(previous.get(QUEUE_POSITION_TAG), position) else {}
    said_place, _, said_at = previous.get(POSITION_SAID_TAG, "").partition(" at ")
    if not place_moved(said_place or None, position) or (said_at and now - seconds_from_tag(said_at) < POSITION_EVERY):
        return Decision(CapacityState.WAITING, tags, waited_seconds=waited)
    return Decision(CapacityState.WAITING, {**tags, POSITION_SAID_TAG: f"{text} at {time_tag(now)}"},
                    Event(f"Still waiting for GPU capacity of class {gpu_class.name!r}: now {place}",
                          {"GPU class": gpu_class.name, "Position": text, **in_queue}),
                    waited_seconds=waited)


def write_order(decision: Decision, place: int | None) -> tuple[int, int]:
    """Which decisions of a pass are written first when its writes do not all fit (`write_budget`):
    a run's end, then a change of state (capacity arrived, a pod failing), then a wait told for the
    first time or changed, then moves in line; each the first in line first. A decision left out
    is decided again on the next pass, from the same tags.

    >>> wait = Decision(CapacityState.WAITING, {"gpufn/capacity": "waiting"})
    >>> moved = Decision(CapacityState.WAITING, {".dagster/gpufn-queue-position": "2 of 3"})
    >>> arrived = Decision(CapacityState.SCHEDULED, {"gpufn/capacity": "scheduled"})
    >>> ended = Decision(CapacityState.TIMED_OUT, fail="gave up")
    >>> sorted([(moved, 2), (wait, 9), (wait, 3), (arrived, 7), (ended, 8)], key=lambda d: write_order(*d))[0][1]
    8
    >>> [place for _, place in sorted([(moved, 2), (wait, 9), (wait, 3), (arrived, 7)], key=lambda d: write_order(*d))]
    [7, 3, 9, 2]
    """
    if decision.fail is not None:
        rank = 0
    elif decision.state is not CapacityState.WAITING:
        rank = 1
    elif CAPACITY_TAG in decision.tags or CAPACITY_REPORTED_TAG in decision.tags:
        rank = 2
    else:
        rank = 3
    return rank, place or 0


def decide_without_pod(previous: Mapping[str, str], job: str | None, job_failure: str | None) -> Decision:
    """What to record for a STARTING GPU run that has no pod: its Job is making a new one, failed, or is gone.

    `job` is the Job's name (None when it is gone too); `job_failure` the Job's Failed condition
    ("reason: message"), None when it has not failed.

    >>> decide_without_pod({"gpufn/capacity": "scheduled"}, "dagster-run-1", None).tags["gpufn/capacity"]
    'replacing'
    >>> decide_without_pod({}, None, None).fail.split(" (")[0]
    "The GPU run's Kubernetes Job and pod are gone before its run worker started"
    """
    if job is None:
        return _failed(CapacityState.LOST, CapacityReason.POD_LOST,
                       "The GPU run's Kubernetes Job and pod are gone before its run worker started (deleted, or its "
                       "node was lost); re-execute the run.")
    if job_failure is not None:
        return _failed(CapacityState.LOST, CapacityReason.JOB_FAILED,
                       f"The GPU run's Kubernetes Job {job} failed before its run worker started: {job_failure}")
    had_pod = previous.get(CAPACITY_TAG) in (CapacityState.WAITING.value, CapacityState.SCHEDULED.value, CapacityState.GATED.value,
                                             CapacityState.FAILING.value)
    if not had_pod:
        return Decision()  # its Job has not made its first pod yet
    return Decision(CapacityState.REPLACING,
                    {CAPACITY_TAG: CapacityState.REPLACING.value, CAPACITY_REASON_TAG: CapacityReason.POD_REPLACING.value},
                    Event(f"The GPU run's pod is gone (deleted, or its node was lost); its Job {job} is creating a "
                          "new one", {"Job": job}))
