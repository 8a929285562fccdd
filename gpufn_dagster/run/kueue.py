"""Kueue mode, the pure half: the labels a class's Jobs carry, the Kueue objects that match the
classes, and what a Kueue Workload says about the run whose Job it stands for.

A class with `kueue: {local_queue: ...}` hands its run and step Jobs to that LocalQueue: Kueue's
webhook suspends each Job, its scheduler admits the Job's Workload when the ClusterQueue has
quota (in priority order, preempting lower priorities where the queue allows), and only then
does the Job make a pod. Until then the run is waiting -- not failed, not orphaned -- and what
Kueue says about it (its conditions' reasons and messages, verbatim) is what the run shows.

Nothing here calls Kubernetes; `watch.py` lists the Workloads once per tick and asks this module.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..classes import GpuClass
from ..k8s_syntax import parse_quantity
from ..tags import DAGSTER_PRIORITY_TAG, KUEUE_WAITING, KueueState

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
API = "kueue.x-k8s.io/v1beta2"


def run_priority(run_tags: Mapping[str, str]) -> int:
    """A run's `dagster/priority` (0 when absent or not an integer, as Dagster's queue reads it).

    >>> run_priority({"dagster/priority": "10"}), run_priority({}), run_priority({"dagster/priority": "high"})
    (10, 0, 0)
    """
    try:
        return int(run_tags.get(DAGSTER_PRIORITY_TAG, "0"))
    except ValueError:
        return 0


def kueue_labels(gpu_class: GpuClass, priority: int = 0, alternatives: tuple[GpuClass, ...] = ()) -> dict[str, str]:
    """The labels that hand a Job of `gpu_class` to its Kueue LocalQueue (none outside Kueue mode);
    with `alternatives`, classes accepted after it in order, to the LocalQueue of that choice
    (`choice_local_queue`), whose ClusterQueue has their flavors in that order. The priority class
    is the first class's.

    >>> from gpufn_dagster.classes import GpuClass
    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1,
    ...               kueue={"local_queue": "gpu-l4", "priority_classes": {10: "gpu-high", 0: "gpu-normal"}})
    >>> kueue_labels(l4, 12)
    {'kueue.x-k8s.io/queue-name': 'gpu-l4', 'kueue.x-k8s.io/priority-class': 'gpu-high'}
    """
    if gpu_class.kueue is None:
        return {}
    labels = {QUEUE_LABEL: choice_local_queue((gpu_class, *alternatives)) if alternatives
              else gpu_class.kueue.local_queue}
    if (name := gpu_class.kueue.priority_class_for(priority)) is not None:
        labels[PRIORITY_LABEL] = name
    return labels


def cluster_queue_name(gpu_class: GpuClass) -> str:
    """The ClusterQueue `kueue_manifests` makes for a class."""
    return f"gpufn-{gpu_class.name}"


# The cohort of every ClusterQueue `kueue_manifests` makes: a choice's ClusterQueue owns no quota
# and borrows its classes' unused quota from their ClusterQueues, so a GPU is never counted twice.
COHORT = "gpufn"


def choice_local_queue(accepted: tuple[GpuClass, ...]) -> str:
    """The LocalQueue (and ClusterQueue) of Jobs that accept several classes in this order.

    >>> from gpufn_dagster.classes import GpuClass
    >>> h100, a100 = (GpuClass(name=n, gpu_model="X", gpu_memory="80GiB", max_gpu_count_per_worker=8)
    ...               for n in ("h100-80gb", "a100-80gb"))
    >>> choice_local_queue((h100, a100))
    'gpufn-h100-80gb-or-a100-80gb'
    """
    name = "gpufn-" + "-or-".join(c.name for c in accepted)
    if len(name) <= 63:  # a label value (the Job's queue-name label names it)
        return name
    return "gpufn-choice-" + hashlib.sha256("|".join(c.name for c in accepted).encode()).hexdigest()[:16]


def quota_resource(gpu_class: GpuClass) -> tuple[str, int]:
    """The resource Kueue counts a class's GPUs as, and how many of it one GPU is: the class's
    resource, or for a DRA claim the `device_resource` Kueue's deviceClassMappings name its devices."""
    if gpu_class.claims_devices and gpu_class.kueue is not None and gpu_class.kueue.device_resource:
        assert gpu_class.dra is not None
        return gpu_class.kueue.device_resource, gpu_class.dra.count_per_gpu
    return gpu_class.resource_name, 1


def _quota(gpu_class: GpuClass, count: int) -> list[dict[str, Any]]:
    """A flavor's quota of `count` GPUs of the class, and the CPU and memory of that many workers."""
    resource, per_gpu = quota_resource(gpu_class)
    return [{"name": "cpu", "nominalQuota": _times(gpu_class.cpu or "1", count)},
            {"name": "memory", "nominalQuota": _times(gpu_class.memory or "4Gi", count)},
            {"name": resource, "nominalQuota": str(count * per_gpu)}]


def kueue_manifests(classes: Iterable[GpuClass], gpus: Mapping[str, int], namespace: str,
                    choices: Iterable[tuple[str, ...]] = ()) -> list[dict[str, Any]]:
    """The Kueue objects matching the classes in Kueue mode: per class a ResourceFlavor (the class's
    node selector and tolerations), a ClusterQueue `gpufn-<class>` whose quota is `gpus[class]`
    GPUs (and the CPU and memory of that many workers), preempting lower priorities within it, a
    LocalQueue in `namespace`; and every WorkloadPriorityClass the classes name, valued by the
    `dagster/priority` threshold that selects it.

    Each of `choices` (classes a Function accepts in order) gets a ClusterQueue whose flavors are
    those classes in that order -- Kueue admits a Workload on the first flavor with room, its own
    flavor fungibility -- with no quota of its own: it borrows its classes' from their
    ClusterQueues (all in cohort `gpufn`), so the GPUs of a class are counted once; and its
    LocalQueue (`choice_local_queue`).

    >>> from gpufn_dagster.classes import GpuClass
    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1, cpu="4",
    ...               node_selector={"pool": "l4"}, kueue={"local_queue": "gpu-l4", "priority_class": "gpu-normal"})
    >>> [(m["kind"], m["metadata"]["name"]) for m in kueue_manifests([l4], {"l4": 8}, "dagster")]
    [('ResourceFlavor', 'l4'), ('ClusterQueue', 'gpufn-l4'), ('LocalQueue', 'gpu-l4'), ('WorkloadPriorityClass', 'gpu-normal')]
    """
    classes = list(classes)
    by_name = {c.name: c for c in classes if c.kueue is not None}
    objects: list[dict[str, Any]] = []
    priorities: dict[str, int] = {}
    for gpu_class in by_name.values():
        count = gpus.get(gpu_class.name, gpu_class.max_gpu_count_per_worker)
        quota = _quota(gpu_class, count)
        objects += [
            {"apiVersion": API, "kind": "ResourceFlavor", "metadata": {"name": gpu_class.name},
             "spec": {"nodeLabels": dict(gpu_class.node_selector),
                      "tolerations": [_camel(t.to_k8s()) for t in gpu_class.tolerations]}},
            _cluster_queue(cluster_queue_name(gpu_class), [(gpu_class, quota)]),
            _local_queue(gpu_class.kueue.local_queue, namespace, cluster_queue_name(gpu_class)),
        ]
        if gpu_class.kueue.priority_class is not None:
            priorities.setdefault(gpu_class.kueue.priority_class, 0)
        for threshold, name in gpu_class.kueue.priority_classes.items():
            priorities.setdefault(name, threshold)
    for names in choices:
        accepted = tuple(by_name[name] for name in names)  # KeyError: not a class in Kueue mode
        name = choice_local_queue(accepted)
        objects += [_cluster_queue(name, [(c, _quota(c, 0)) for c in accepted]), _local_queue(name, namespace, name)]
    objects += [{"apiVersion": API, "kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value,
                 "description": f"gpufn runs of dagster/priority {value} and above"}
                for name, value in sorted(priorities.items(), key=lambda item: -item[1])]
    return objects


def _cluster_queue(name: str, flavors: list[tuple[GpuClass, list[dict[str, Any]]]]) -> dict[str, Any]:
    """A ClusterQueue of flavors tried in this order (each a class and its quota), in cohort `gpufn`."""
    return {"apiVersion": API, "kind": "ClusterQueue", "metadata": {"name": name},
            "spec": {"namespaceSelector": {}, "queueingStrategy": "BestEffortFIFO", "cohortName": COHORT,
                     "preemption": {"withinClusterQueue": "LowerPriority"},
                     "resourceGroups": [{"coveredResources": [q["name"] for q in flavors[0][1]],
                                         "flavors": [{"name": c.name, "resources": quota} for c, quota in flavors]}]}}


def _local_queue(name: str, namespace: str, cluster_queue: str) -> dict[str, Any]:
    return {"apiVersion": API, "kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace},
            "spec": {"clusterQueue": cluster_queue}}


def _times(quantity: str, count: int) -> str:
    """`count` times a Kubernetes quantity, in its own unit when it has a whole number of them.

    >>> _times("16Gi", 4), _times("4", 4), _times("500m", 3), _times("1.5Gi", 2)
    ('64Gi', '16', '1500m', '3221225472')
    """
    match = re.fullmatch(r"(\d+)([A-Za-z]*)", quantity)
    if match:
        return f"{int(match[1]) * count}{match[2]}"
    return str(int(parse_quantity(quantity) * count))


def _camel(toleration: Mapping[str, Any]) -> dict[str, Any]:
    """A toleration as a Kubernetes manifest spells it (the class's converter gives snake_case)."""
    return {("tolerationSeconds" if k == "toleration_seconds" else k): v for k, v in toleration.items()}


_BEYOND_MAXIMUM = re.compile(r">\s*maximum capacity")
EXCEEDS_MAX_QUOTA = "ExceedsMaxQuota"  # Kueue's QuotaReserved reason for a request beyond the queue's maximum


def exceeds_maximum_capacity(message: str) -> bool:
    """Whether Kueue's pending message says the request is more than the ClusterQueue can ever hold
    (its nominal quota plus what it may borrow), so waiting cannot help.

    >>> exceeds_maximum_capacity("couldn't assign flavors to pod set main: insufficient quota for "
    ...                          "nvidia.com/gpu in flavor l4, request > maximum capacity (0)")
    True
    >>> exceeds_maximum_capacity("couldn't assign flavors to pod set main: insufficient unused quota for "
    ...                          "nvidia.com/gpu in flavor l4, 1 more needed")
    False
    """
    return bool(_BEYOND_MAXIMUM.search(message))


@dataclass(frozen=True)
class WorkloadStatus:
    """What Kueue says of one Workload: `state` is one of pending, admitted, evicted, preempted,
    finished; `reason` and `message` are Kueue's own, from the condition that decided the state."""

    name: str
    job: str | None
    cluster_queue: str | None
    priority: int
    created: str
    state: str
    reason: str
    message: str

    @property
    def waiting(self) -> bool:
        return self.state in KUEUE_WAITING

    def describe(self) -> str:
        """Kueue's words for the event: the condition, its reason, its message verbatim."""
        condition = {KueueState.PENDING: "QuotaReserved=False", KueueState.QUOTA_RESERVED: "QuotaReserved",
                     KueueState.ADMITTED: "Admitted", KueueState.FINISHED: "Finished"}.get(self.state, "Evicted")
        return f"{condition} ({self.reason}): {self.message}" if self.message else f"{condition} ({self.reason})"


def _true(condition: Mapping[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def _condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    return next((c for c in (workload.get("status") or {}).get("conditions") or [] if c.get("type") == kind), None)


def workload_status(workload: Mapping[str, Any], cluster_queues: Mapping[str, str]) -> WorkloadStatus:
    """Read a Workload (as the API returns it). `cluster_queues` maps "<namespace>/<LocalQueue>" to
    its ClusterQueue, for a Workload not admitted yet (an admitted one names its own).

    An evicted Workload that is waiting again keeps its Evicted condition: it is shown as evicted
    (or preempted, Kueue's reason `Preempted`) until Kueue reserves quota for it again.

    >>> pending = {"metadata": {"name": "job-a-1", "namespace": "ns", "creationTimestamp": "2026-12-01T07:04:09Z",
    ...            "ownerReferences": [{"kind": "Job", "name": "a"}]},
    ...            "spec": {"queueName": "gpu-l4", "priority": 10},
    ...            "status": {"conditions": [{"type": "QuotaReserved", "status": "False", "reason": "Pending",
    ...                       "message": "couldn't assign flavors to pod set main: insufficient unused quota for "
    ...                                  "nvidia.com/gpu in flavor l4, 1 more needed"}]}}
    >>> status = workload_status(pending, {"ns/gpu-l4": "gpufn-l4"})
    >>> status.state, status.cluster_queue, status.job, status.describe()[:46]
    ('pending', 'gpufn-l4', 'a', "QuotaReserved=False (Pending): couldn't assign")
    """
    metadata, spec, status = workload.get("metadata") or {}, workload.get("spec") or {}, workload.get("status") or {}
    job = next((o.get("name") for o in metadata.get("ownerReferences") or [] if o.get("kind") == "Job"), None)
    admission = status.get("admission") or {}
    queue = admission.get("clusterQueue") or cluster_queues.get(f"{metadata.get('namespace')}/{spec.get('queueName')}")
    state, reason, message = KueueState.PENDING, "Pending", ""
    finished, admitted = _condition(workload, "Finished"), _condition(workload, "Admitted")
    reserved, evicted = _condition(workload, "QuotaReserved"), _condition(workload, "Evicted")
    if _true(finished):
        state, reason, message = KueueState.FINISHED, finished.get("reason", ""), finished.get("message", "")
    elif _true(admitted):
        state, reason, message = KueueState.ADMITTED, admitted.get("reason", ""), admitted.get("message", "")
    elif _true(evicted):
        reason, message = evicted.get("reason", ""), evicted.get("message", "")
        state = KueueState.PREEMPTED if reason == "Preempted" else KueueState.EVICTED
        if reserved is not None and not _true(reserved) and reserved.get("message"):
            message = f"{message}; now {reserved.get('reason')}: {reserved.get('message')}"
    elif reserved is not None:
        state = KueueState.QUOTA_RESERVED if _true(reserved) else KueueState.PENDING  # reserved: admission checks still run
        reason, message = reserved.get("reason", ""), reserved.get("message", "")
    return WorkloadStatus(name=metadata.get("name", ""), job=job, cluster_queue=queue,
                          priority=int(spec.get("priority") or 0), created=metadata.get("creationTimestamp") or "",
                          state=state.value, reason=reason, message=message)


def queue_positions(statuses: Iterable[WorkloadStatus]) -> dict[str, tuple[int, int]]:
    """Workload name -> (place, of how many) among the Workloads waiting in its ClusterQueue, in the
    order Kueue's BestEffortFIFO admits them: higher priority first, then the older.

    >>> w = lambda name, priority, created: WorkloadStatus(name, None, "q", priority, created, "pending", "", "")
    >>> queue_positions([w("a", 0, "2026-12-01T07:00:00Z"), w("b", 10, "2026-12-01T07:05:00Z"),
    ...                  w("c", 0, "2026-12-01T06:59:00Z")])
    {'b': (1, 3), 'c': (2, 3), 'a': (3, 3)}
    """
    queues: dict[str | None, list[WorkloadStatus]] = {}
    for status in statuses:
        if status.waiting:
            queues.setdefault(status.cluster_queue, []).append(status)
    positions = {}
    for items in queues.values():
        ordered = sorted(items, key=lambda s: (-s.priority, s.created, s.name))
        positions.update({s.name: (i + 1, len(ordered)) for i, s in enumerate(ordered)})
    return positions
