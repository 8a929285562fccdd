"""Pod status -> capacity verdict. Pure: no API calls, no clock reads.

A GPU run worker's pod is *waiting for capacity* when the scheduler reports it Unschedulable
for want of room (Insufficient <resource>, too many pods, node affinity/taint mismatches on the
other pools) and a node of its class could hold it once free. It *never fits* when no node of
the class could hold the request even empty. A pod held by scheduling gates, or failing for a
reason that is not scheduling (image pull, crash), is reported as what it is -- never as a wait.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kubernetes.utils.quantity import parse_quantity

from .classes import GpuClass

_SCHEDULER_MESSAGE = re.compile(r"^0/(?P<nodes>\d+) nodes are available: (?P<reasons>.*?)(?:\.\s|\.$|$)", re.S)
_REASON = re.compile(r"^(?P<count>\d+) (?P<reason>.+)$", re.S)
_NOT_CAPACITY_WAITING = {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "CrashLoopBackOff",
                         "CreateContainerConfigError", "CreateContainerError", "RunContainerError"}
AUTOSCALER_REASONS = {"TriggeredScaleUp", "NotTriggerScaleUp", "Nominated", "ScaleUpTimedOut"}


class State(str, Enum):
    SCHEDULED = "scheduled"
    WAITING = "waiting"
    NEVER_FITS = "never-fits"
    GATED = "gated"
    FAILING = "failing"
    PENDING = "pending"  # created, not evaluated by the scheduler yet


@dataclass(frozen=True)
class SchedulerReasons:
    """The scheduler's `0/N nodes are available: …` message as a histogram (it sorts reasons as strings)."""

    nodes: int
    counts: Mapping[str, int]

    def summary(self) -> str:
        parts = sorted(self.counts.items(), key=lambda item: (-item[1], item[0]))
        return "; ".join(f"{reason}: {count} of {self.nodes} nodes" for reason, count in parts)


def parse_scheduler_message(message: str) -> SchedulerReasons | None:
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
    state: State
    reason: str = ""
    message: str = ""
    node: str | None = None
    reasons: SchedulerReasons | None = None
    autoscaler: tuple[str, ...] = field(default_factory=tuple)


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, Mapping) else getattr(obj, key, None)
    return obj


def class_nodes(gpu_class: GpuClass, nodes: Iterable[Any]) -> list[Any]:
    """Nodes of the class's pool: they carry every label of its node selector."""
    selector = gpu_class.node_selector
    return [n for n in nodes if all((_get(n, "metadata", "labels") or {}).get(k) == v for k, v in selector.items())]


def could_ever_fit(gpu_class: GpuClass, gpu_count: int, pool: Iterable[Any]) -> bool | None:
    """Whether some node of the pool holds the request when empty; None when the pool has no node
    (an autoscaler may still add one)."""
    pool = list(pool)
    if not pool:
        return None
    for node in pool:
        capacity = _get(node, "status", "allocatable") or {}
        if parse_quantity(capacity.get(gpu_class.resource_name, "0")) >= gpu_count:
            return True
    return False


def pod_verdict(pod: Any, events: Iterable[Any], gpu_class: GpuClass, gpu_count: int,
                pool: Iterable[Any]) -> Verdict:
    """What the pod of a GPU run is doing, from its status, its events and the class's nodes."""
    node = _get(pod, "spec", "node_name") or _get(pod, "spec", "nodeName")
    statuses = _get(pod, "status", "container_statuses") or _get(pod, "status", "containerStatuses") or []
    for status in statuses:
        waiting = _get(status, "state", "waiting")
        if waiting and _get(waiting, "reason") in _NOT_CAPACITY_WAITING:
            return Verdict(State.FAILING, _get(waiting, "reason"), _get(waiting, "message") or "", node=node)
    if node:
        return Verdict(State.SCHEDULED, node=node)
    autoscaler = tuple(sorted({_get(e, "reason") for e in events if _get(e, "reason") in AUTOSCALER_REASONS}))
    conditions = _get(pod, "status", "conditions") or []
    scheduled = next((c for c in conditions if _get(c, "type") == "PodScheduled"), None)
    gates = _get(pod, "spec", "scheduling_gates") or _get(pod, "spec", "schedulingGates")
    if gates or (scheduled is not None and _get(scheduled, "reason") == "SchedulingGated"):
        names = ", ".join(_get(g, "name") or str(g) for g in gates or [])
        return Verdict(State.GATED, "SchedulingGated", f"held by scheduling gates {names}".strip(), autoscaler=autoscaler)
    if scheduled is None or _get(scheduled, "status") != "False" or _get(scheduled, "reason") != "Unschedulable":
        return Verdict(State.PENDING, autoscaler=autoscaler)
    message = _get(scheduled, "message") or ""
    reasons = parse_scheduler_message(message)
    if could_ever_fit(gpu_class, gpu_count, pool) is False:
        return Verdict(State.NEVER_FITS, "Unschedulable",
                       f"no node of GPU class {gpu_class.name!r} has {gpu_count} x {gpu_class.resource_name} "
                       f"allocatable even when empty; the scheduler says: {message}", reasons=reasons, autoscaler=autoscaler)
    return Verdict(State.WAITING, "Unschedulable", message, reasons=reasons, autoscaler=autoscaler)
