"""Watching GPU runs that wait for capacity on Kubernetes, and saying so in the Dagster UI.

Nothing in Dagster calls the launcher while a run is STARTING, so a tick (run by the
`gpu_capacity` sensor in the daemon, or by `gpufn capacity --watch`) does it: one list of GPU run
pods (label selector), one of their events, one of nodes and one of Jobs cover every GPU run,
whatever their number. For each STARTING GPU run it turns the pod's status into a verdict
(`capacity.pod_verdict`) and records what changed:

- waiting: tag `gpufn/capacity=waiting` (+ `gpufn/waiting-since`), an event with the class, the
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

Every Kubernetes call has a request timeout and goes through dagster-k8s's retry of transient
errors, so a frozen API server ends a tick with that reason; the next tick starts afresh.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dagster import DagsterInstance, DagsterRunStatus, RunsFilter
from dagster._core.events import EngineEventData
from dagster_k8s.client import k8s_api_retry

from .capacity import State, Verdict, class_nodes, pod_verdict
from .classes import GpuClass
from .launcher import PLACEMENT_TAG
from .placement import CLASS_LABEL
from .tags import CAPACITY_REASON_TAG, CAPACITY_TAG, GPU_CLASS_TAG, GPU_COUNT_TAG, tag_value

WAITING_SINCE_TAG = "gpufn/waiting-since"
REPORTED_TAG = "gpufn/capacity-reported"
_FINISHED = {DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED}
_EVENT_REASONS = {"FailedScheduling", "TriggeredScaleUp", "NotTriggerScaleUp", "Nominated", "ScaleUpTimedOut"}
# (connect, read) seconds for each Kubernetes call; a tick makes a handful of calls.
REQUEST_TIMEOUT = (5.0, 20.0)


@dataclass
class ClassReport:
    waiting: int = 0
    longest_wait_seconds: float = 0.0
    running: int = 0


@dataclass
class TickReport:
    """What one tick saw and did; the sensor shows it, `gpufn capacity` prints it."""

    classes: dict[str, ClassReport] = field(default_factory=lambda: defaultdict(ClassReport))
    failed_runs: list[str] = field(default_factory=list)
    deleted_jobs: list[str] = field(default_factory=list)
    runs_checked: int = 0

    def summary(self) -> str:
        parts = [f"{name}: {r.waiting} waiting (longest {r.longest_wait_seconds:.0f}s), {r.running} placed"
                 for name, r in sorted(self.classes.items())]
        extra = []
        if self.failed_runs:
            extra.append(f"failed {len(self.failed_runs)} run(s)")
        if self.deleted_jobs:
            extra.append(f"deleted {len(self.deleted_jobs)} orphan Job(s)")
        return "; ".join(parts + extra) or "no GPU run is starting"


def _name(obj: Any) -> str:
    return obj.metadata.name


def _job_of(pod: Any) -> tuple[str, str] | None:
    """(name, namespace) of the Job that owns a pod, from the label the Job controller sets."""
    name = (pod.metadata.labels or {}).get("job-name")
    return (name, pod.metadata.namespace) if name else None


def _run_id(obj: Any) -> str | None:
    return (obj.metadata.labels or {}).get("dagster/run-id")


class CapacityWatcher:
    """One object per daemon; `tick()` is cheap to call every few seconds."""

    def __init__(self, instance: DagsterInstance, core_api: Any, batch_api: Any, classes: Mapping[str, GpuClass],
                 namespace: str | None = None, request_timeout: tuple[float, float] = REQUEST_TIMEOUT):
        self.instance, self.core, self.batch, self.classes, self.namespace = (
            instance, core_api, batch_api, classes, namespace)
        self.request_timeout = request_timeout

    def _api(self, fn, *args, **kwargs):
        """One Kubernetes call: bounded in time, transient errors retried (dagster-k8s's boundary)."""
        return k8s_api_retry(lambda: fn(*args, **kwargs, _request_timeout=self.request_timeout), max_retries=2,
                             timeout=1.0)

    def _list(self, namespaced, everywhere, **kwargs):
        if self.namespace:
            return self._api(namespaced, self.namespace, **kwargs).items
        return self._api(everywhere, **kwargs).items

    def tick(self, now: float | None = None) -> TickReport:
        now = time.time() if now is None else now
        report = TickReport()
        selector = CLASS_LABEL
        pods = self._list(self.core.list_namespaced_pod, self.core.list_pod_for_all_namespaces, label_selector=selector)
        jobs = self._list(self.batch.list_namespaced_job, self.batch.list_job_for_all_namespaces, label_selector=selector)
        pods_by_run = {_run_id(p): p for p in pods if _run_id(p)}
        starting = self.instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.STARTING], tags={PLACEMENT_TAG: "gpu"}))
        report.runs_checked = len(starting)
        waiting_pods = {_name(p) for p in pods if not p.spec.node_name}
        events = defaultdict(list)
        if waiting_pods:
            for event in self._list(self.core.list_namespaced_event, self.core.list_event_for_all_namespaces,
                                    field_selector="involvedObject.kind=Pod"):
                if event.involved_object.name in waiting_pods and event.reason in _EVENT_REASONS:
                    events[event.involved_object.name].append(event)
        nodes = self._api(self.core.list_node).items if starting else []
        jobs_by_run = {_run_id(j): j for j in jobs if _run_id(j)}

        verdicts: dict[str, tuple[Any, GpuClass, int, Verdict]] = {}
        for run in starting:
            gpu_class = self.classes.get(run.tags.get(GPU_CLASS_TAG, ""))
            pod = pods_by_run.get(run.run_id)
            if gpu_class is None:
                continue
            if pod is None:
                self._check_lost(run, jobs_by_run.get(run.run_id), report)
                continue
            count = int(run.tags.get(GPU_COUNT_TAG, "1"))
            verdict = pod_verdict(pod, events.get(_name(pod), []), gpu_class, count, class_nodes(gpu_class, nodes))
            verdicts[run.run_id] = (run, gpu_class, count, verdict)

        # Positions among runs waiting on the same class, oldest wait first.
        queue: dict[str, list[tuple[float, str]]] = defaultdict(list)
        for run_id, (run, gpu_class, _, verdict) in verdicts.items():
            if verdict.state is State.WAITING:
                since = float(run.tags.get(WAITING_SINCE_TAG, now))
                queue[gpu_class.name].append((since, run_id))
        position = {run_id: (i + 1, len(items)) for items in queue.values()
                    for i, (_, run_id) in enumerate(sorted(items))}

        for run_id, (run, gpu_class, count, verdict) in verdicts.items():
            self._record(run, gpu_class, count, verdict, position.get(run_id), pods_by_run[run_id], now, report)

        self._delete_orphans(jobs, pods_by_run, report)
        return report

    def _event(self, run, message: str, metadata: dict[str, Any]) -> None:
        self.instance.report_engine_event(message, run, EngineEventData(metadata), cls=self.__class__)

    def _record(self, run, gpu_class: GpuClass, count: int, verdict: Verdict, position, pod, now: float,
                report: TickReport) -> None:
        previous = run.tags.get(CAPACITY_TAG)
        stats = report.classes[gpu_class.name]
        request = f"{count} x {gpu_class.resource_name}"
        if verdict.state is State.WAITING:
            since = float(run.tags.get(WAITING_SINCE_TAG, now))
            waited = now - since
            stats.waiting += 1
            stats.longest_wait_seconds = max(stats.longest_wait_seconds, waited)
            if gpu_class.max_wait is not None and waited > gpu_class.max_wait.total_seconds():
                self._fail(run, "timed-out", report,
                           f"Gave up waiting for GPU capacity of class {gpu_class.name!r} after {waited:.0f}s "
                           f"(max_wait {gpu_class.max_wait.total_seconds():.0f}s); its Job was deleted. "
                           f"Last scheduler message: {verdict.message}", job=_job_of(pod))
                return
            # What the last event said, as a tag: ticks may run in a fresh process each time. The
            # position is not part of it, or every wait would be re-reported whenever the queue moves.
            key = hashlib.sha1(f"{verdict.message}|{verdict.autoscaler}".encode()).hexdigest()[:12]
            if run.tags.get(REPORTED_TAG) == key and previous == "waiting":
                return
            top = max(verdict.reasons.counts.items(), key=lambda item: item[1])[0] if verdict.reasons and \
                verdict.reasons.counts else verdict.reason
            self.instance.add_run_tags(run.run_id, {CAPACITY_TAG: "waiting", WAITING_SINCE_TAG: f"{since:.0f}",
                                                    REPORTED_TAG: key, CAPACITY_REASON_TAG: tag_value(top)})
            place = f"position {position[0]} of {position[1]} waiting on this class" if position else ""
            autoscaler = f" Autoscaler: {', '.join(verdict.autoscaler)}." if verdict.autoscaler else ""
            self._event(run, f"Waiting for GPU capacity: class {gpu_class.name!r}, {request}, since "
                             f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(since))}; {place}. "
                             f"Scheduler: {verdict.message}{autoscaler}",
                        {"GPU class": gpu_class.name, "Requested": request, "Waiting since": since,
                         "Scheduler message": verdict.message,
                         "Reasons": verdict.reasons.summary() if verdict.reasons else verdict.message,
                         "Position": f"{position[0]} of {position[1]}" if position else "",
                         "Autoscaler": ", ".join(verdict.autoscaler) or "no reaction"})
        elif verdict.state is State.SCHEDULED:
            stats.running += 1
            if previous == "waiting":
                waited = now - float(run.tags.get(WAITING_SINCE_TAG, now))
                self._event(run, f"GPU capacity arrived: scheduled on node {verdict.node} after waiting {waited:.0f}s",
                            {"Node": verdict.node, "Waited seconds": round(waited, 1), "GPU class": gpu_class.name})
            if previous != "scheduled":
                self.instance.add_run_tags(run.run_id, {CAPACITY_TAG: "scheduled",
                                                        CAPACITY_REASON_TAG: tag_value(f"on {verdict.node}")})
        elif verdict.state is State.NEVER_FITS:
            self._fail(run, "never-fits", report, f"This run can never start: {verdict.message}", job=_job_of(pod))
        elif verdict.state in (State.GATED, State.FAILING) and previous != verdict.state.value:
            what = ("held by scheduling gates (not a capacity wait)" if verdict.state is State.GATED
                    else f"pod is failing to start: {verdict.reason} (not a capacity wait)")
            self.instance.add_run_tags(run.run_id, {CAPACITY_TAG: verdict.state.value})
            self._event(run, f"GPU run {what}: {verdict.message}", {"Reason": verdict.reason})

    def _check_lost(self, run, job, report: TickReport) -> None:
        """A STARTING GPU run with no pod: its Job is making a new one, has failed, or is gone."""
        if job is None:
            # Listed before this run's Job existed? Ask for it by its run id before failing anything.
            if self._list(self.batch.list_namespaced_job, self.batch.list_job_for_all_namespaces,
                          label_selector=f"dagster/run-id={run.run_id}"):
                return
            self._fail(run, "lost", report, "The GPU run's Kubernetes Job and pod are gone before its run worker "
                                            "started (deleted, or its node was lost); re-execute the run.")
            return
        failed = next((c for c in job.status.conditions or [] if c.type == "Failed" and c.status == "True"), None)
        if failed is not None:
            self._fail(run, "lost", report, f"The GPU run's Kubernetes Job {_name(job)} failed before its run worker "
                                            f"started: {failed.reason}: {failed.message}",
                       job=(_name(job), job.metadata.namespace))
        elif run.tags.get(CAPACITY_TAG) in ("waiting", "scheduled", "gated", "failing"):  # it had a pod
            self.instance.add_run_tags(run.run_id, {CAPACITY_TAG: "replacing"})
            self._event(run, f"The GPU run's pod is gone (deleted, or its node was lost); its Job {_name(job)} "
                             "is creating a new one", {"Job": _name(job)})

    def _delete_job(self, name: str, namespace: str, report: TickReport) -> None:
        self._api(self.batch.delete_namespaced_job, name, namespace, propagation_policy="Background")
        report.deleted_jobs.append(name)

    def _fail(self, run, state: str, report: TickReport, message: str,
              job: tuple[str, str] | None = None) -> None:
        """Fail the run with that reason, deleting its Job (name, namespace) if it has one."""
        self.instance.add_run_tags(run.run_id, {CAPACITY_TAG: state})
        if job is not None:
            self._delete_job(*job, report)
        self.instance.report_run_failed(run, message)
        report.failed_runs.append(run.run_id)

    def _delete_orphans(self, jobs, pods_by_run, report: TickReport) -> None:
        active = [j for j in jobs if (j.status.active or 0) > 0 and _run_id(j)]
        if not active:
            return
        runs = {r.run_id: r for r in self.instance.get_runs(RunsFilter(run_ids=[_run_id(j) for j in active]))}
        for job in active:
            run = runs.get(_run_id(job))
            if run is not None and run.status in _FINISHED and _name(job) not in report.deleted_jobs:
                self._delete_job(_name(job), job.metadata.namespace, report)
                self.instance.report_engine_event(
                    f"Deleted Kubernetes Job {_name(job)}: the run is {run.status.value} but its pod was still "
                    "waiting or running", run, cls=self.__class__)


def waiting_runs(instance: DagsterInstance, now: float | None = None) -> dict[str, list[tuple[str, float]]]:
    """GPU class -> (run id, seconds waited) of every run waiting for capacity, longest first.

    Works for both modes: queued runs waiting for a local slot and STARTING runs waiting on Kubernetes.
    """
    now = time.time() if now is None else now
    runs = instance.get_runs(RunsFilter(statuses=[DagsterRunStatus.QUEUED, DagsterRunStatus.STARTING],
                                        tags={CAPACITY_TAG: "waiting"}))
    out: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for run in runs:
        since = float(run.tags.get(WAITING_SINCE_TAG, now))
        out[run.tags.get(GPU_CLASS_TAG, "?")].append((run.run_id, now - since))
    return {name: sorted(items, key=lambda item: -item[1]) for name, items in sorted(out.items())}


def capacity_sensor(*, namespace: str | None = None, classes_dir: str | None = None,
                    minimum_interval_seconds: int = 10, running: bool = True,
                    request_timeout: tuple[float, float] = REQUEST_TIMEOUT):
    """The `gpu_capacity` sensor: a watcher tick per evaluation; its tick history is the operator view.

    Args:
        namespace: where the GPU run Jobs are (default: the launcher's `job_namespace`).
        classes_dir: the GPU class files (default: the launcher's).
        minimum_interval_seconds: how often it ticks.
        running: whether it starts running (default) or stopped.
        request_timeout: (connect, read) seconds for each Kubernetes call of a tick.
    """
    import dagster as dg
    import kubernetes
    import urllib3
    from dagster_k8s.client import DagsterK8sAPIRetryLimitExceeded, DagsterK8sUnrecoverableAPIError

    from .classes import cached_gpu_classes
    from .launcher import GpuK8sRunLauncher, KubernetesUnavailable

    @dg.sensor(name="gpu_capacity", minimum_interval_seconds=minimum_interval_seconds,
               default_status=dg.DefaultSensorStatus.RUNNING if running else dg.DefaultSensorStatus.STOPPED,
               description="Reports GPU runs waiting for capacity on Kubernetes, per class; enforces max_wait; "
                           "deletes Jobs of runs that ended while their pod waited.")
    def gpu_capacity(context):
        launcher = context.instance.run_launcher
        if not isinstance(launcher, GpuK8sRunLauncher):
            return dg.SkipReason("the run launcher is not GpuK8sRunLauncher; local GPU slots are waited for in "
                                 "the run queue")
        # Constructing the launcher loaded its Kubernetes configuration as the client default.
        watcher = CapacityWatcher(context.instance, kubernetes.client.CoreV1Api(), kubernetes.client.BatchV1Api(),
                                  cached_gpu_classes(classes_dir or launcher.classes_dir),
                                  namespace or launcher.job_namespace, request_timeout=request_timeout)
        try:
            report = watcher.tick()
        except (urllib3.exceptions.HTTPError, kubernetes.client.ApiException, DagsterK8sAPIRetryLimitExceeded,
                DagsterK8sUnrecoverableAPIError) as err:
            host = kubernetes.client.Configuration.get_default_copy().host
            raise KubernetesUnavailable(f"this tick could not finish: the Kubernetes API at {host} failed or did "
                                        f"not answer within {request_timeout[1]:.0f}s ({type(err).__name__}: "
                                        f"{str(err).splitlines()[0][:300]}); runs keep waiting and the next tick "
                                        "starts afresh") from err
        context.log.info(report.summary())
        return dg.SkipReason(report.summary())

    return gpu_capacity
