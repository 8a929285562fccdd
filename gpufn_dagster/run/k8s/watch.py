"""Watching GPU runs that wait for capacity on Kubernetes, and saying so in the Dagster UI.

Nothing in Dagster calls the launcher while a run is STARTING, so a tick (run by the
`gpu_capacity` sensor in the daemon, or by `gpufn capacity --watch`) does it: one list of GPU run
pods (label selector), one of their events, one of nodes and one of Jobs cover every GPU run,
whatever their number. A tick observes (those lists, read before it touches any run), lines the
runs up (each run's verdict from its pod's status, `capacity.pod_verdict`, or its Workload's, and
the lines per class and ClusterQueue), judges (`capacity.decide`, for every case) and applies the
decisions as they come -- it decides nothing itself:

- waiting: tag `gpufn/capacity=waiting` (+ `.dagster/gpufn-waiting-since`), an event with the class, the
  request, since when, the scheduler's message verbatim and as a histogram, the run's position
  among runs waiting on the class, and autoscaler reactions (TriggeredScaleUp, NotTriggerScaleUp,
  Karpenter's Nominated);
- scheduled: an event with the node and the time waited, tag `gpufn/capacity=scheduled`;
- never fits / past the class's `max_wait`: the run fails with that reason and its Job (and pod)
  is deleted;
- held by scheduling gates, or failing to start (image pull, crash): reported as that, not as a wait.

It also deletes the Job of any GPU run that finished (failed, canceled, timed out) while its pod
still waits or runs, so no launched run leaves an orphan behind; and fails a STARTING GPU run whose
pod and Job are gone (a lost spot node, a deleted pod whose Job gave up), which would otherwise
stay STARTING forever with the start timeout off.

Every Kubernetes call goes through `client.call` (a request timeout, dagster-k8s's retry of
transient errors), so a frozen API server ends a tick with that reason; the next tick starts afresh.
Its writes to the instance stop after `write_seconds` (`write_budget`), the first in line first
(`capacity.write_order`): 10,000 runs starting to wait at once are told over several ticks, none
held past the sensor's deadline. The runs it judges are kept between ticks (`kept_runs`), and so,
under the sensor, are its lists of pods, Jobs, events and nodes: watches keep them current
(`informers`), so a steady tick over 10,000 waiting runs receives no list from the API.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg
import kubernetes
from dagster import DagsterInstance, DagsterRunNotFoundError, DagsterRunStatus, RunsFilter

from ...class_files import cached_gpu_classes, ClassesDir
from ...class_requests import accept, choice_view
from ...classes import GpuClass
from ...private_ledger import EngineEventData
from ...errors import GpuClassError
from ...tags import (CLASS_LABEL, CLASSES_ANNOTATION, COUNT_LABEL, GOT_CLASS_ANNOTATION, GPU_CLASS_TAG, PLACEMENT_TAG,
                    RUN_GPU_COUNT_TAG, CapacityState, KueueState, RunKind, waiting_since)
from .. import kueue
from ...device_cel import DeviceCount
from ..capacity import (AUTOSCALER_REASONS, Decision, Verdict, class_gpus, class_nodes, decide, decide_admitted, decide_without_pod, dra_gpus,
                       kueue_verdict, pod_verdict, queue_positions, write_order)
from ..claims import class_got
from ..gauges import CAPACITY_SENSOR, ClassGauges, observations, pod_counts, store_gauges
from ..history import report_estimates
from .client import (API_ERRORS, REQUEST_TIMEOUT, TICK_DEADLINE, View, answered_status, api_error, api_host, call,
                      client_without_retries, list_views)
from .informers import Informers
from .launcher import GpuK8sRunLauncher
from ..kept_runs import KeptRuns
from ..run_plan import choice_note, release_ended_runs, tag_got_class
from ..write_budget import WRITE_SECONDS, WriteBudget

_FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
# The events a tick lists: about pods, less the scheduler's FailedScheduling, one per waiting pod
# (most of the list's bytes at 10,000 waiting pods), whose words the pod's PodScheduled condition
# already carries; what a tick reads from events is the autoscalers' reactions (`capacity.AUTOSCALER_REASONS`).
_EVENTS_LISTED = "involvedObject.kind=Pod,reason!=FailedScheduling"


def gpu_runs() -> KeptRuns:
    """The runs a tick judges: STARTING runs placed on a GPU run worker, and STARTING or STARTED
    runs placed per step (their steps' pods)."""
    return KeptRuns({RunKind.GPU.value: frozenset({DagsterRunStatus.STARTING}),
                     RunKind.PER_STEP.value: frozenset({DagsterRunStatus.STARTING, DagsterRunStatus.STARTED})})


@dataclass
class ClassReport:
    waiting: int = 0  # GPU pods (a run's, or a shard step's) waiting for the class
    longest_wait_seconds: float = 0.0
    running: int = 0
    estimate_last: str = ""  # the wait estimate of the last run in line
    waiting_runs: set[str] = field(default_factory=set)


@dataclass
class TickReport:
    """What one tick saw and did; the sensor shows it, `gpufn capacity` prints it."""

    classes: dict[str, ClassReport] = field(default_factory=lambda: defaultdict(ClassReport))
    failed_runs: list[str] = field(default_factory=list)
    deleted_jobs: list[str] = field(default_factory=list)
    runs_checked: int = 0
    left_out: int = 0  # runs whose writes did not fit in the tick's write budget: written on the next tick
    stored: list[ClassGauges] = field(default_factory=list)  # every class's gauges, as the tick stored them

    def count(self, gpu_class: str, decision: Decision, run: Any) -> None:
        stats = self.classes[gpu_class]
        if decision.state is CapacityState.WAITING:
            stats.waiting += 1
            stats.waiting_runs.add(run.run_id)
            stats.longest_wait_seconds = max(stats.longest_wait_seconds, decision.waited_seconds)
        elif decision.state is CapacityState.SCHEDULED:
            stats.running += 1

    def gauges(self, classes: Mapping[str, GpuClass], nodes: list[Any], pods: list[Any],
               dra: Mapping[str, DeviceCount] | None = None) -> list[ClassGauges]:
        """Every class's gauges: its GPUs from its nodes (a DRA class's from its ResourceSlices), use and pods not placed from the GPU pods
        the tick read, runs waiting and the longest wait from its decisions; and a line of its own
        for each choice of classes with pods or runs waiting (their GPUs together), as embedded."""
        counts = pod_counts(pods)
        lines = {name: (gpu_class,) for name, gpu_class in classes.items()}
        for name in {*counts, *self.classes} - set(classes):
            if len(accepted := accept(name, None, classes, lenient=True)) > 1:
                lines[name] = accepted
        return [ClassGauges(name, "gpu", sum(class_gpus(c, nodes, dra) for c in accepted), counts.get(name, (0, 0))[0],
                            counts.get(name, (0, 0))[1], len(self.classes[name].waiting_runs),
                            self.classes[name].longest_wait_seconds)
                for name, accepted in sorted(lines.items())]

    def summary(self) -> str:
        parts = [f"{name}: {r.waiting} waiting (longest {r.longest_wait_seconds:.0f}s"
                 f"{'; last in line: ' + r.estimate_last if r.estimate_last else ''}), {r.running} placed"
                 for name, r in sorted(self.classes.items())]
        extra = []
        if self.failed_runs:
            extra.append(f"failed {len(self.failed_runs)} run(s)")
        if self.deleted_jobs:
            extra.append(f"deleted {len(self.deleted_jobs)} orphan Job(s)")
        if self.left_out:
            extra.append(f"{self.left_out} run update(s) (tags, event) left for the next tick: this one spent "
                         "its write budget, first in line first")
        return "; ".join(parts + extra) or "no GPU run is starting"


def _name(obj: Any) -> str:
    return obj.metadata.name


def _job_of(pod: Any) -> tuple[str, str] | None:
    """(name, namespace) of the Job that owns a pod, from the label the Job controller sets."""
    name = (pod.metadata.labels or {}).get("job-name")
    return (name, pod.metadata.namespace) if name else None


def _step_of(pod: Any) -> str | None:
    """The step a step pod of `k8s_job_executor` runs (its `dagster/op` label), None for a run pod."""
    labels = pod.metadata.labels or {}
    return labels.get("dagster/op") if labels.get("app.kubernetes.io/component") == "step_worker" else None


def _placed_choices(pods: list[Any]) -> list[Any]:
    """The pods that accept several classes, placed on a node, whose class got is not noted yet."""
    return [p for p in pods if p.spec.node_name and CLASSES_ANNOTATION in (p.metadata.annotations or {})
            and GOT_CLASS_ANNOTATION not in (p.metadata.annotations or {})]


def _run_id(obj: Any) -> str | None:
    return (obj.metadata.labels or {}).get("dagster/run-id")


def _job_failure(job: Any) -> str | None:
    """The Job's Failed condition as "reason: message", None when it has not failed."""
    failed = next((c for c in job.status.conditions or [] if c.type == "Failed" and c.status == "True"), None)
    return f"{failed.reason}: {failed.message}" if failed is not None else None


@dataclass(frozen=True)
class _Seen:
    """What one tick read, before it touched a run."""

    pods: list[Any]
    jobs: list[Any]
    starting: list[Any]  # GPU runs placed on their run worker, still STARTING
    per_step: list[Any]  # runs placed per step, STARTING or STARTED
    events: Mapping[str, list[Any]]  # scheduling events by pod name
    nodes: list[Any]
    workloads: Mapping[tuple[str, str], kueue.WorkloadStatus]
    dra: Mapping[str, DeviceCount] = field(default_factory=dict)  # a DRA class's GPUs per node, by class name

    def dra_for(self, accepted: tuple[GpuClass, ...]) -> DeviceCount | None:
        """The GPUs per node of DRA classes accepted together (each node's most of any one class:
        the claim gets its devices from one of them); None for extended-resource classes."""
        if accepted[0].dra is None:
            return None
        counts = [self.dra.get(c.name, DeviceCount()) for c in accepted]
        nodes = {node for count in counts for node in count.by_node}
        return DeviceCount({node: max(c.by_node.get(node, 0) for c in counts) for node in nodes},
                           sum(c.unsure for c in counts))


@dataclass
class _Lines:
    """Where each starting run stands, and the lines the waiting ones form."""

    kueue_positions: Mapping[str, tuple[int, int]]
    verdicts: dict[str, tuple[Any, GpuClass, int, Verdict, tuple[str, str] | None]] = field(default_factory=dict)
    queued: dict[str, tuple[Any, GpuClass, kueue.WorkloadStatus, Any]] = field(default_factory=dict)
    admitted: list[tuple[Any, kueue.WorkloadStatus]] = field(default_factory=list)
    podless: list[tuple[Any, Any]] = field(default_factory=list)
    positions: dict[str, tuple[int, int]] = field(default_factory=dict)
    classes: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))  # run ids in line per class
    cluster_queues: dict[str | None, list[str]] = field(default_factory=lambda: defaultdict(list))

    def place(self, run_id: str) -> int | None:
        """A waiting run's place in its line (its class's, or its ClusterQueue's), None for others."""
        if run_id in self.positions:
            return self.positions[run_id][0]
        queued = self.queued.get(run_id)
        return self.kueue_positions.get(queued[2].name, (None, 0))[0] if queued else None


class CapacityWatcher:
    """One object per daemon; `tick()` is cheap to call every few seconds."""

    def __init__(self, instance: DagsterInstance, core_api: Any, batch_api: Any, classes: Mapping[str, GpuClass],
                 namespace: str | None = None, request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
                 custom_api: Any = None, deadline_seconds: float = TICK_DEADLINE,
                 write_seconds: float | None = WRITE_SECONDS, runs: KeptRuns | None = None,
                 informers: Informers | None = None):
        self.instance, self.core, self.batch, self.classes, self.namespace = (
            instance, core_api, batch_api, classes, namespace)
        self.request_timeout = request_timeout
        self.deadline_seconds = deadline_seconds
        self.write_seconds = write_seconds  # the most a tick spends writing tags and events (`write_budget`)
        self.runs = runs or gpu_runs()  # the GPU runs it judges, kept between ticks (the sensor keeps one)
        # Its pods, Jobs, events and nodes kept current by watches between ticks (the sensor keeps
        # one); None: every tick lists them afresh.
        self.informers = informers
        self._deadline: float | None = None  # when the current tick's time on the API ends (time.monotonic())
        # Kueue's Workloads and LocalQueues, read only when some class is in Kueue mode.
        self.custom = custom_api or kubernetes.client.CustomObjectsApi(core_api.api_client)
        self._resource: Any = None  # DeviceClasses, ResourceSlices and claims: only when some class is a DRA class
        self._pools: dict[tuple[str, ...], list[Any]] = {}  # this tick's nodes per choice of classes

    def _call(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return call(fn, *args, request_timeout=self.request_timeout, deadline=self._deadline, **kwargs)

    def _lists(self) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, str]]]:
        """The tick's own lists, each as (list call, its arguments, selectors), in the watcher's namespace."""
        core, batch, namespaced = self.core, self.batch, (self.namespace,) if self.namespace else ()
        return {"pods": (core.list_namespaced_pod if namespaced else core.list_pod_for_all_namespaces, namespaced,
                         {"label_selector": CLASS_LABEL}),
                "jobs": (batch.list_namespaced_job if namespaced else batch.list_job_for_all_namespaces, namespaced,
                         {"label_selector": CLASS_LABEL}),
                "events": (core.list_namespaced_event if namespaced else core.list_event_for_all_namespaces,
                           namespaced, {"field_selector": _EVENTS_LISTED}),
                "nodes": (core.list_node, (), {})}

    def _read(self, fn: Callable[..., Any], args: tuple[Any, ...], selectors: dict[str, str], keep: bool = True
              ) -> list[View]:
        """A list as `View`s (a tick reads a few fields of every GPU run's objects, never their
        timestamps, and parsing 10,000 pods through the client's models would be most of it): one of
        the tick's own lists as an informer keeps it when the watcher has them (`keep`), waiting for
        its first read only as long as the tick's deadline allows; else listed now."""
        if self.informers is None or not keep:
            return list_views(fn, *args, request_timeout=self.request_timeout, deadline=self._deadline, **selectors)
        left = self.deadline_seconds if self._deadline is None else self._deadline - time.monotonic()
        return self.informers.of(fn, args, selectors).wait(left)

    def _pool(self, accepted: tuple[GpuClass, ...], nodes: list[Any]) -> list[Any]:
        """The nodes of every class accepted: where the pod may land (once per tick and choice of
        classes, not per run: 10,000 runs over 1,000 nodes would be ten million label checks)."""
        key = tuple(c.name for c in accepted)  # the tick's nodes: the cache is cleared when it ends
        if key not in self._pools:
            self._pools[key] = [node for gpu_class in accepted for node in class_nodes(gpu_class, nodes)]
        return self._pools[key]

    def tick(self, now: float | None = None) -> TickReport:
        """One pass over every GPU run; its API calls together take at most `deadline_seconds`.

        The tick's lists are read before it touches a run, so a tick whose API does not answer in
        time raises (KubernetesUnavailable, through the sensor) having changed nothing.
        """
        self._deadline = time.monotonic() + self.deadline_seconds
        try:
            return self._tick(time.time() if now is None else now)
        finally:
            self._deadline = None
            self._pools.clear()

    def _tick(self, now: float) -> TickReport:
        report = TickReport()
        seen = self._observe()
        report.runs_checked = len(seen.starting) + len(seen.per_step)
        lines = self._lines(seen, now)
        judged = list(self._judge(seen, lines, now))
        for run, decision, _, gpu_class in judged:
            if gpu_class is not None:
                report.count(gpu_class, decision, run)
        budget = WriteBudget.seconds(self.write_seconds)
        for run, decision, job, _ in sorted(judged, key=lambda item: write_order(item[1], lines.place(item[0].run_id))):
            if decision.fail is not None or ((decision.tags or decision.event) and budget.allows()):
                self._apply(run, decision, job, report)
        self._estimate(lines, seen, report, now, budget)
        report.left_out = budget.left_out
        self._note_classes_got(seen)
        report.stored = report.gauges(self.classes, seen.nodes, seen.pods, seen.dra)
        store_gauges(self.instance, report.stored, now)
        self._delete_orphans(seen.jobs, {r.run_id for r in [*seen.starting, *seen.per_step]}, report)
        release_ended_runs(self.instance)
        return report

    def _observe(self) -> _Seen:
        """Every list the tick reads, before it touches a run: GPU pods and Jobs (by label), the GPU
        runs starting (and those placed per step), the autoscalers' events, nodes and Kueue's Workloads."""
        lists = self._lists()
        if self.informers is not None:  # kept lists: all four read side by side from the first tick on
            for listed in lists.values():
                self.informers.of(*listed)
        pods, jobs = self._read(*lists["pods"]), self._read(*lists["jobs"])
        kept = self.runs.read(self.instance)
        starting = [r for r in kept if r.tags.get(PLACEMENT_TAG) == RunKind.GPU.value]
        per_step = [r for r in kept if r.tags.get(PLACEMENT_TAG) == RunKind.PER_STEP.value]
        waiting_pods = {_name(p) for p in pods if not p.spec.node_name}
        events = self._scheduling_events(waiting_pods, self._read(*lists["events"]) if waiting_pods else [])
        nodes = self._read(*lists["nodes"]) if starting or per_step or _placed_choices(pods) else []
        workloads = self._workloads() if (starting or per_step) and any(c.kueue for c in self.classes.values()) else {}
        return _Seen(pods, jobs, starting, per_step, events, nodes, workloads, self._dra(nodes) if nodes else {})

    @property
    def resource(self) -> Any:
        """The resource.k8s.io API, on the core API's client (made when a DRA class first needs it)."""
        if self._resource is None:
            self._resource = kubernetes.client.ResourceV1Api(self.core.api_client)
        return self._resource

    def _dra(self, nodes: list[Any]) -> dict[str, DeviceCount]:
        """Each DRA class's GPUs per node, from the DeviceClasses and ResourceSlices (two list calls)."""
        dra_classes = [c for c in self.classes.values() if c.dra is not None]
        if not dra_classes:
            return {}
        device_classes = {d.metadata.name: d for d in list_views(self.resource.list_device_class, request_timeout=self.request_timeout,
                                                                 deadline=self._deadline)}
        slices = list_views(self.resource.list_resource_slice, request_timeout=self.request_timeout,
                            deadline=self._deadline)
        return {c.name: dra_gpus(c, device_classes.get(c.dra.device_class), slices, nodes) for c in dra_classes}

    def _lines(self, seen: _Seen, now: float) -> _Lines:
        """Each starting run's standing: its pod's verdict, or its Workload waiting in Kueue, or
        neither; and the lines they form -- per class (the longest-waiting first) and per ClusterQueue."""
        lines = _Lines(kueue_positions=kueue.queue_positions(seen.workloads.values()))
        pods_by_run = {_run_id(p): p for p in seen.pods if _run_id(p) and not _step_of(p)}
        jobs_by_run = {_run_id(j): j for j in seen.jobs if _run_id(j)}
        list_jobs, in_namespace, _ = self._lists()["jobs"]
        for run in seen.starting:
            accepted = accept(run.tags.get(GPU_CLASS_TAG, ""), None, self.classes, lenient=True)
            if not accepted:
                continue
            gpu_class = choice_view(accepted)  # several classes: the run waits in the line of their request
            job, pod = jobs_by_run.get(run.run_id), pods_by_run.get(run.run_id)
            workload = seen.workloads.get((job.metadata.namespace, _name(job))) if job is not None else None
            if workload is not None and workload.waiting:
                lines.queued[run.run_id] = (run, gpu_class, workload, job)
                continue
            if workload is not None:
                lines.admitted.append((run, workload))
            if pod is None:
                # A run listed before its Job existed has lost nothing: it is looked up again here,
                # while observing, so judging and applying make no API call.
                if (workload is None or workload.state != KueueState.ADMITTED) and not (
                        job is None and self._read(list_jobs, in_namespace,
                                                   {"label_selector": f"dagster/run-id={run.run_id}"}, keep=False)):
                    lines.podless.append((run, job))
                continue
            count = int(run.tags.get(RUN_GPU_COUNT_TAG, "1"))
            verdict = pod_verdict(pod, seen.events.get(_name(pod), []), gpu_class, count,
                                  self._pool(accepted, seen.nodes), seen.dra_for(accepted))
            lines.verdicts[run.run_id] = (run, gpu_class, count, verdict, _job_of(pod))
        lines.positions = queue_positions({
            run_id: (gpu_class.name, waiting_since(run.tags, now))
            for run_id, (run, gpu_class, _, verdict, _) in lines.verdicts.items()
            if verdict.state is CapacityState.WAITING})
        for run_id in sorted(lines.positions, key=lambda r: lines.positions[r][0]):
            lines.classes[lines.verdicts[run_id][1].name].append(run_id)
        # Each ClusterQueue's line as runs (a Job's run from its label; a Job not ours by its name).
        run_of_job = {(j.metadata.namespace, _name(j)): _run_id(j) for j in seen.jobs}
        for key, workload in sorted(((k, w) for k, w in seen.workloads.items() if w.name in lines.kueue_positions),
                                    key=lambda item: lines.kueue_positions[item[1].name][0]):
            lines.cluster_queues[workload.cluster_queue].append(run_of_job.get(key) or workload.job)
        return lines

    def _judge(self, seen: _Seen, lines: _Lines, now: float) -> Iterator[tuple[Any, Decision, tuple[str, str] | None,
                                                                               str | None]]:
        """(run, its decision, its Job as (name, namespace), the class it counts on) for every run
        the tick has something to say about; `capacity` makes every decision."""
        for run, workload in lines.admitted:
            decision = decide_admitted(run.tags, workload)
            if decision is not None:
                yield run, decision, None, None
        for run, job in lines.podless:
            if job is None:
                yield run, decide_without_pod(run.tags, None, None), None, None
            else:
                job_ref = (_name(job), job.metadata.namespace)
                yield run, decide_without_pod(run.tags, _name(job), _job_failure(job)), job_ref, None
        for run_id, (run, gpu_class, count, verdict, job) in lines.verdicts.items():
            place = lines.positions.get(run_id)
            ahead = lines.classes[gpu_class.name][:place[0] - 1] if place else []
            yield run, decide(verdict, run.tags, gpu_class, count, place, now, ahead=ahead), job, gpu_class.name
        for run, gpu_class, workload, job in lines.queued.values():
            place = lines.kueue_positions.get(workload.name)
            ahead = list(dict.fromkeys(lines.cluster_queues[workload.cluster_queue][:place[0] - 1])) if place else []
            yield run, decide(kueue_verdict(workload), run.tags, gpu_class, int(run.tags.get(RUN_GPU_COUNT_TAG, "1")),
                              place, now, cluster_queue=workload.cluster_queue, ahead=ahead,
                              kueue_state=workload.state), (_name(job), job.metadata.namespace), gpu_class.name
        yield from self._step_pods(seen, now)

    def _estimate(self, lines: _Lines, seen: _Seen, report: TickReport, now: float, budget: WriteBudget) -> None:
        """A wait estimate on every waiting run, from its line on the class and the class's GPUs (nodes x GPUs)."""
        waiting: dict[str, list[tuple[int, Any]]] = defaultdict(list)
        for run_id, (run, gpu_class, _, verdict, _) in lines.verdicts.items():
            if verdict.state is CapacityState.WAITING and run_id in lines.positions:
                waiting[gpu_class.name].append((lines.positions[run_id][0], run))
        for run, gpu_class, workload, _ in lines.queued.values():
            waiting[gpu_class.name].append((lines.kueue_positions.get(workload.name, (10**9, 0))[0], run))
        if not waiting:
            return
        capacities = {name: sum(class_gpus(c, seen.nodes, seen.dra) for c in accept(name, None, self.classes, lenient=True))
                      for name in waiting}
        ordered = {name: [run for _, run in sorted(items, key=lambda item: item[0])] for name, items in waiting.items()}
        for name, estimate in report_estimates(self.instance, ordered, capacities, now, self.__class__, budget).items():
            report.classes[name].estimate_last = estimate.text

    def _step_pods(self, seen: _Seen, now: float) -> Iterator[tuple[Any, Decision, tuple[str, str] | None, str]]:
        """Runs placed per step: their GPU step pods (a fanned-out refresh's shards, the steps of a run
        mixing classes) -- and in Kueue mode their step Jobs Kueue keeps suspended -- are judged like
        a run's pod: tag and event on the run, naming the steps that wait; when several wait, the
        run's tag and event follow the first of them."""
        step_jobs = [j for j in seen.jobs if _step_of(j)]
        by_run: dict[str, list[Any]] = defaultdict(list)
        for obj in [*(p for p in seen.pods if _step_of(p)), *step_jobs]:
            by_run[_run_id(obj) or ""].append(obj)
        job_ids = {id(job) for job in step_jobs}
        for run in seen.per_step:
            judged = []  # (step, job as (name, namespace), class, GPU count, verdict)
            for obj in by_run.get(run.run_id, []):
                labels = obj.metadata.labels or {}
                accepted = accept((obj.metadata.annotations or {}).get(CLASSES_ANNOTATION)
                                  or labels.get(CLASS_LABEL, ""), None, self.classes, lenient=True)
                if not accepted:
                    continue
                gpu_class = choice_view(accepted)
                count = int(labels.get(COUNT_LABEL, "1"))
                if id(obj) in job_ids:
                    workload = seen.workloads.get((obj.metadata.namespace, _name(obj)))
                    if workload is not None and workload.waiting:
                        judged.append((_step_of(obj), (_name(obj), obj.metadata.namespace), gpu_class, count,
                                       kueue_verdict(workload)))
                    continue
                verdict = pod_verdict(obj, seen.events.get(_name(obj), []), gpu_class, count,
                                      self._pool(accepted, seen.nodes), seen.dra_for(accepted))
                judged.append((_step_of(obj), _job_of(obj), gpu_class, count, verdict))
            if not judged:
                continue
            waiting = [j for j in judged if j[4].state is CapacityState.WAITING]
            _, job, gpu_class, count, verdict = (waiting or judged)[0]
            yield run, decide(verdict, run.tags, gpu_class, count, None, now,
                              steps=[w[0] or "?" for w in waiting]), job, gpu_class.name

    def _note_classes_got(self, seen: _Seen) -> None:
        """For each pod that accepts several classes and was placed since the last tick: the class of
        the node it landed on, on its run (`GOT_CLASS_TAG`, an event) and on the pod (an annotation,
        so it is said once, and the class's gauges count its GPUs)."""
        nodes = {_name(node): node for node in seen.nodes}
        for pod in _placed_choices(seen.pods):
            accepted, run_id = accept(pod.metadata.annotations[CLASSES_ANNOTATION], None, self.classes, lenient=True), _run_id(pod)
            if not accepted:
                continue
            node = nodes.get(pod.spec.node_name)
            got = (self._claim_got(pod, accepted) if accepted[0].claims_devices else
                   next((c for c in accepted if node is not None and class_nodes(c, [node])), None))
            run = self.instance.get_run_by_id(run_id) if run_id else None
            if got is None or run is None:
                continue
            tag_got_class(self.instance, run.run_id, got.name)
            step = _step_of(pod)
            self.instance.report_engine_event(
                f"{'Step ' + step + ': ' if step else ''}GPU class {got.name!r} got: its pod was placed on node "
                f"{pod.spec.node_name}{choice_note(accepted, got, 'had no room')}", run,
                EngineEventData({"GPU class got": got.name, "GPU classes accepted": ", ".join(c.name for c in accepted),
                                 "Node": pod.spec.node_name, **({"Step": step} if step else {})}),
                cls=self.__class__)
            self._call(self.core.patch_namespaced_pod, _name(pod), pod.metadata.namespace,
                       {"metadata": {"annotations": {GOT_CLASS_ANNOTATION: got.name}}})
            pod.metadata.annotations[GOT_CLASS_ANNOTATION] = got.name  # as written: this tick's gauges count it

    def _claim_got(self, pod: Any, accepted: tuple[GpuClass, ...]) -> GpuClass | None:
        """The class whose `firstAvailable` subrequest the allocator gave the pod's claim."""
        statuses = pod.status.resource_claim_statuses or []
        name = next((s.resource_claim_name for s in statuses if s.resource_claim_name), None)
        if name is None:
            return None
        answer = self._call(self.resource.read_namespaced_resource_claim, name, pod.metadata.namespace,
                            _preload_content=False)
        return class_got(json.loads(answer.data), accepted)

    def _workloads(self) -> dict[tuple[str, str], kueue.WorkloadStatus]:
        """Kueue's Workloads by (namespace, Job name): two list calls per tick, whatever the number of runs."""
        def items(plural: str) -> list[dict[str, Any]]:
            if self.namespace:
                return self._call(self.custom.list_namespaced_custom_object, "kueue.x-k8s.io", "v1beta2",
                                  self.namespace, plural)["items"]
            return self._call(self.custom.list_cluster_custom_object, "kueue.x-k8s.io", "v1beta2", plural)["items"]

        try:
            local_queues = items("localqueues")
        except API_ERRORS as err:
            if answered_status(err) == 404:  # Kueue is not installed: no Workload can hold a run back
                return {}
            raise
        cluster_queues = {f"{q['metadata']['namespace']}/{q['metadata']['name']}": (q.get("spec") or {}).get("clusterQueue")
                          for q in local_queues}
        statuses = {}
        for workload in items("workloads"):
            status = kueue.workload_status(workload, cluster_queues)
            if status.job:
                statuses[(workload["metadata"]["namespace"], status.job)] = status
        return statuses

    @staticmethod
    def _scheduling_events(waiting_pods: set[str], listed: list[View]) -> dict[str, list[Any]]:
        """The autoscalers' events about pods that are not bound yet, by pod name."""
        events: dict[str, list[Any]] = defaultdict(list)
        for event in listed:
            if event.reason in AUTOSCALER_REASONS and event.involved_object.name in waiting_pods:
                events[event.involved_object.name].append(event)
        return events

    def _apply(self, run: Any, decision: Decision, job: tuple[str, str] | None, report: TickReport) -> None:
        """Carry out a decision: tags, then the event, then (when it fails the run) the Job and the failure."""
        if decision.tags:
            try:
                self.instance.add_run_tags(run.run_id, dict(decision.tags))
            except DagsterRunNotFoundError:  # deleted since the runs were last read whole
                self.runs.forget(run.run_id)
                return
        if decision.event is not None:
            self.instance.report_engine_event(decision.event.message, run, EngineEventData(dict(decision.event.metadata)),
                                              cls=self.__class__)
        if decision.fail is not None:
            if job is not None:
                self._delete_job(*job, report)
            self.instance.report_run_failed(run, decision.fail)
            report.failed_runs.append(run.run_id)

    def _delete_job(self, name: str, namespace: str, report: TickReport) -> None:
        """Delete a Job; one already gone (terminate deleted it first) counts as deleted."""
        try:
            self._call(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")
        except API_ERRORS as err:
            if answered_status(err) != 404:
                raise
        report.deleted_jobs.append(name)

    def _delete_orphans(self, jobs: list[Any], going: set[str], report: TickReport) -> None:
        """Delete the Job of every GPU run that ended while its pod still waited or ran, or while Kueue
        still kept it suspended; `going`: the runs this tick read as STARTING or STARTED (not ended,
        so not read again)."""
        # A Job Kueue keeps suspended has no active pod but still holds its place in the queue.
        # A Job already being deleted (terminate got there first) is left to that deletion.
        active = [j for j in jobs if ((j.status.active or 0) > 0 or j.spec.suspend) and _run_id(j)
                  and _run_id(j) not in going and not j.metadata.deletion_timestamp]
        if not active:
            return
        runs = {r.run_id: r for r in self.instance.get_runs(RunsFilter(run_ids=[_run_id(j) for j in active]))}
        for job in active:
            run = runs.get(_run_id(job))
            if run is not None and run.status in _FINISHED and _name(job) not in report.deleted_jobs:
                self._delete_job(_name(job), job.metadata.namespace, report)
                self.instance.report_engine_event(
                    f"Deleted Kubernetes Job {_name(job)}: the run is {run.status.value} but its pod was still "
                    "waiting or running", run, EngineEventData({"Job": _name(job), "Run status": run.status.value}),
                    cls=self.__class__)


def capacity_sensor(*, namespace: str | None = None, classes_dir: ClassesDir = None,
                    minimum_interval_seconds: int = 10, running: bool = True,
                    request_timeout: tuple[float, float] = REQUEST_TIMEOUT,
                    deadline_seconds: float = TICK_DEADLINE,
                    write_seconds: float = WRITE_SECONDS) -> dg.SensorDefinition:
    """The `gpu_capacity` sensor: a watcher tick per evaluation; its tick history is the operator view.

    Args:
        namespace: where the GPU run Jobs are (default: the launcher's `job_namespace`).
        classes_dir: the GPU class files (default: the launcher's).
        minimum_interval_seconds: how often it ticks.
        running: whether it starts running (default) or stopped.
        request_timeout: (connect, read) seconds for each Kubernetes call of a tick.
        deadline_seconds: the most a whole tick spends on the Kubernetes API (all calls, retries
            included); a tick against a frozen API server ends then, saying the API did not answer.
        write_seconds: the most a tick spends writing runs' tags and events; when many runs start
            waiting at once, the rest (later in line) is written on the next ticks.

    Example:
        >>> capacity_sensor(minimum_interval_seconds=30).name
        'gpu_capacity'
    """

    runs = gpu_runs()  # kept between this sensor's ticks in the process that evaluates it
    informers = Informers()  # the ticks' lists of pods, Jobs, events and nodes, kept current by watches

    @dg.sensor(name=CAPACITY_SENSOR, minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED,
               description="Reports GPU runs waiting for capacity on Kubernetes, per class; enforces max_wait; "
                           "deletes Jobs of runs that ended while their pod waited; observes each class's gauges "
                           "(gpu_capacity/<class> assets).")
    def gpu_capacity(context: dg.SensorEvaluationContext) -> dg.SkipReason | dg.SensorResult:
        launcher = context.instance.run_launcher
        if not isinstance(launcher, GpuK8sRunLauncher):
            return dg.SkipReason("the run launcher is not GpuK8sRunLauncher; local GPU slots are waited for in "
                                 "the run queue")
        try:
            classes = cached_gpu_classes(classes_dir or launcher.classes_dir)
        except GpuClassError as err:  # runs keep waiting as they are; the next tick after the fix goes on
            context.log.warning(str(err))
            return dg.SkipReason(f"GPU class files do not load, so this tick judged no run (waiting runs keep "
                                 f"waiting; new GPU runs are refused at launch until they load): {err}")
        # Constructing the launcher loaded its Kubernetes configuration as the client default.
        client = client_without_retries()
        watcher = CapacityWatcher(context.instance, kubernetes.client.CoreV1Api(client),
                                  kubernetes.client.BatchV1Api(client), classes, namespace or launcher.job_namespace,
                                  request_timeout=request_timeout, custom_api=kubernetes.client.CustomObjectsApi(client),
                                  deadline_seconds=deadline_seconds, write_seconds=write_seconds, runs=runs,
                                  informers=informers)
        try:
            report = watcher.tick()
        except API_ERRORS as err:
            raise api_error(err, "finish this tick", f"the Kubernetes API at {api_host()}",
                            when_unavailable=f"A tick spends at most {deadline_seconds:.0f}s on the API; runs keep "
                                             "waiting and the next tick starts afresh.",
                            when_rejected="Runs keep waiting; fix the sensor's access to the API.") from err
        context.log.info(report.summary())
        # The tick's gauges, each class's as an observation of its gpu_capacity/<class> asset.
        return dg.SensorResult(skip_reason=report.summary(),  # one asset per class, none per choice
                               asset_events=observations(g for g in report.stored if g.gpu_class in classes))

    return gpu_capacity
