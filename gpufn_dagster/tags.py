"""The closed vocabulary gpufn writes and reads: every `gpufn/…` tag and metadata key and the values
some take, the `gpufn.…` keys it keeps in Lance field metadata and Kubernetes labels, the commit
message its refreshes write, and the one Dagster tag it reads.

A run shows at most three of them in the UI's runs list and run page, the ones a user filters by:
its GPU class, its capacity state (`CapacityState` words) and its placement -- and a fourth, the
class it got, when its Functions accept several. Everything else gpufn
keeps on a run -- why it waits, since when, its place in line, the estimate, what was last said --
is bookkeeping under `HIDDEN_PREFIX`, which Dagster hides from its UI and GraphQL API; the words a
person reads about it are in the run's events. Hidden or not, values stay readable: reasons are
short fixed CamelCase words from `CapacityReason` (the scheduler's prose goes into the run's
event, never into a tag), and times are ISO 8601 in UTC.

>>> time_tag(1796058073), seconds_from_tag("2026-11-30T17:01:13Z")
('2026-11-30T17:01:13Z', 1796058073.0)
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from enum import Enum

PREFIX = "gpufn/"
# Dagster hides run tags under `.dagster/` from its UI and GraphQL API (the prefix of its own
# bookkeeping tags, dagster._core.storage.tags.HIDDEN_TAG_PREFIX; a test holds them equal). A tag
# key has one namespace section at most (Dagster warns of others, and will refuse them), so the
# hidden keys are `.dagster/gpufn-<name>`, not `.dagster/gpufn/<name>` (which releases before
# 2026-12-04 wrote; their runs' bookkeeping is not read).
HIDDEN_PREFIX = ".dagster/gpufn-"

# On Function assets and their ops (the class also on runs, once the launcher has read it from the plan).
GPU_CLASS_TAG = PREFIX + "gpu-class"
GPU_COUNT_TAG = PREFIX + "gpu-count"
RUN_GPU_COUNT_TAG = HIDDEN_PREFIX + "gpu-count"  # on runs: the GPUs per worker of its class
# On runs whose GPU request accepts several classes: the class (or classes, one per step) it got.
GOT_CLASS_TAG = PREFIX + "gpu-class-got"
# On runs: how the launcher placed the run (a `RunKind` value, or "rejected").
PLACEMENT_TAG = PREFIX + "placement"
# On the shard op of a refresh spread over several workers: each shard is a step with its own GPU worker.
SHARD_TAG = PREFIX + "shard"
PLACEMENT_REJECTED = "rejected"
# On runs waiting for, or holding, GPU capacity.
CAPACITY_TAG = PREFIX + "capacity"
CAPACITY_REASON_TAG = HIDDEN_PREFIX + "capacity-reason"
WAITING_SINCE_TAG = HIDDEN_PREFIX + "waiting-since"
CAPACITY_REPORTED_TAG = HIDDEN_PREFIX + "capacity-reported"  # digest of the last wait event, so it is not repeated
WAIT_ESTIMATE_TAG = HIDDEN_PREFIX + "wait-estimate"  # "about 25 min", "now" or "unknown" (run.estimate); then
# "waited 3 min" once the run got its GPUs, "ended" once it ended while waiting: never a stale estimate
HOLDING_SINCE_TAG = HIDDEN_PREFIX + "holding-since"  # when the run got its GPUs (its time on them counts from here)
QUEUE_POSITION_TAG = HIDDEN_PREFIX + "queue-position"  # Kubernetes: "2 of 4", its place among the runs waiting with it
POSITION_SAID_TAG = HIDDEN_PREFIX + "position-said"  # "<position> at <time>": the place a wait event last said, and when
KUEUE_TAG = HIDDEN_PREFIX + "kueue"  # Kueue mode: its Workload's state (a `KueueState` value)
# On runs the embedded launcher handed to a warm run worker: that process's identity (`embedded.procfs.identity`,
# pid@start), by which terminating the run interrupts it from any process.
RUN_WORKER_TAG = HIDDEN_PREFIX + "run-worker"
# On runs started by the table and unfilled-rows sensors (their events say the same in words).
TABLE_TAG = HIDDEN_PREFIX + "table"
TABLE_VERSION_TAG = HIDDEN_PREFIX + "table-version"
UNFILLED_ROWS_TAG = HIDDEN_PREFIX + "unfilled-rows"
# Metadata keys of a Function asset: its spec (in-process; across processes the page shows which
# Python code computes the column), and for a YAML declaration the defs.yaml that declared it (load
# errors name it).
FUNCTION_METADATA_KEY = PREFIX + "function"
DECLARED_IN_METADATA_KEY = PREFIX + "declared-in"
READS_METADATA_KEY = PREFIX + "reads"  # the Functions whose columns it reads (set by build_definitions)
# In the instance's key-value store: the capacity watcher's last tick's gauges per class (`run.gauges`).
CLASS_GAUGES_KEY = PREFIX + "class-gauges"
# In a code location's reconstruction metadata: the schemas of one database's tables as the code
# server read them (`assets.table_schemas`), followed by the database's URI.
TABLE_SCHEMAS_KEY = PREFIX + "table_schemas:"
# Materialization metadata a sensor reads back: the version of the table a Function's refresh read
# (`reporting`), and the source version a materialized view was refreshed from (`views`).
TABLE_VERSION_BEFORE_KEY = "table_version_before"
SOURCE_VERSION_KEY = "source_version"

# Dagster's own run priority tag (its queue and gpufn's Kueue priority classes read it).
DAGSTER_PRIORITY_TAG = "dagster/priority"

# Kubernetes labels on the pods and Jobs of GPU runs and steps: the capacity watcher lists by them.
LABEL_PREFIX = "gpufn.dev/"
CLASS_LABEL = LABEL_PREFIX + "gpu-class"  # the first class a pod accepts (a label value cannot hold a choice)
COUNT_LABEL = LABEL_PREFIX + "gpu-count"
# ... and the annotation of a pod that accepts several classes: its whole request (`choice_request`).
CLASSES_ANNOTATION = LABEL_PREFIX + "gpu-classes"
# ... and, once it is placed, the class of its node (the capacity watcher writes it).
GOT_CLASS_ANNOTATION = LABEL_PREFIX + "gpu-class-got"

# Lance: field metadata on a Function's columns, schema metadata of checkpoint chunks, and the
# messages of the commits gpufn makes -- a refresh's, and a view rebuild carrying Function values
# over. All start with COMMIT_PREFIX, by which the table sensor skips them: they add or change no row.
LANCE_PREFIX = "gpufn."
SIG_COLUMN_KEY = LANCE_PREFIX + "sig_column"  # on each output column: its hidden signature column
FUNCTION_KEY = LANCE_PREFIX + "function"      # on each output column: the Function that writes it
OUTCOME_KEY = LANCE_PREFIX + "outcome"        # on a checkpoint chunk: its rows' errors and counts
COMMIT_PREFIX = "gpufn"
REFRESH_COMMIT_PREFIX = COMMIT_PREFIX + " refresh"
CARRY_COMMIT_MESSAGE = COMMIT_PREFIX + ": carry Function values over a view rebuild"


def refresh_commit_message(function_name: str, version: str) -> str:
    """The commit message of a refresh's DataReplacement.

    >>> refresh_commit_message("docs__embedding", "1a2b")
    'gpufn refresh docs__embedding version 1a2b'
    """
    return f"{REFRESH_COMMIT_PREFIX} {function_name} version {version}"


class RunKind(Enum):
    """Every value of `gpufn/placement` but "rejected": how a run meets GPUs -- not at all, on its run
    worker, in its steps' own pods, or (embedded mode) each GPU step on a local slot of its class."""

    CPU = "cpu"
    GPU = "gpu"
    PER_STEP = "per-step"
    LOCAL = "local"


class KueueState(str, Enum):
    """Every value of `.dagster/gpufn-kueue`: where a run's Workload stands in Kueue (`run.kueue`)."""

    PENDING = "pending"                # no quota reserved yet
    QUOTA_RESERVED = "quota-reserved"  # quota reserved; admission checks still run
    ADMITTED = "admitted"
    PREEMPTED = "preempted"            # evicted for a higher priority; waiting again
    EVICTED = "evicted"                # evicted for another cause (pods not ready in time); waiting again
    FINISHED = "finished"


KUEUE_WAITING = frozenset({KueueState.PENDING, KueueState.QUOTA_RESERVED, KueueState.PREEMPTED, KueueState.EVICTED})


class CapacityState(str, Enum):
    """Every value of `gpufn/capacity`: where a GPU run stands with respect to GPU capacity."""

    WAITING = "waiting"          # no node (or local slot) of the class has room yet; it starts when one does
    RUNNING = "running"          # embedded: its GPU steps got their local slots
    SCHEDULED = "scheduled"      # Kubernetes: its pod is bound to a node of the class
    NEVER_FITS = "never-fits"    # no node of the class could hold the request even empty: failed at once
    TIMED_OUT = "timed-out"      # waited past the class's max_wait: failed, its Job deleted
    GATED = "gated"              # its pod is held by scheduling gates (not a capacity wait)
    FAILING = "failing"          # its pod is failing to start (image pull, crash; not a capacity wait)
    REPLACING = "replacing"      # its pod vanished before the worker started; its Job is making a new one
    LOST = "lost"                # its pod and Job are gone, or the Job failed, before the worker started
    RELEASED = "released"        # the run ended: it holds and waits for no GPU capacity any more
    PENDING = "pending"          # a verdict only (the scheduler has not looked yet); never written as a tag


class CapacityReason(str, Enum):
    """Every value of `.dagster/gpufn-capacity-reason`: short fixed words; the event carries the prose."""

    CLASSES_INVALID = "ClassesInvalid"    # the GPU class files do not load: held in the queue until they do
    CLASSES_LOADED = "ClassesLoaded"      # they load again: the held run goes to the run queue
    LOCAL_SLOTS_IN_USE = "LocalSlotsInUse"
    SLOT_ACQUIRED = "SlotAcquired"
    UNSCHEDULABLE = "Unschedulable"
    KUEUE_PENDING = "KueuePending"        # Kueue has not admitted its Job's Workload (quota, priority)
    KUEUE_PREEMPTED = "KueuePreempted"    # Kueue preempted it for a higher priority; it waits again
    KUEUE_EVICTED = "KueueEvicted"        # Kueue evicted it (e.g. pods not ready in time); it waits again
    SCHEDULED = "Scheduled"
    NEVER_FITS = "NeverFits"
    MAX_WAIT_EXCEEDED = "MaxWaitExceeded"
    SCHEDULING_GATED = "SchedulingGated"
    POD_REPLACING = "PodReplacing"
    POD_LOST = "PodLost"
    JOB_FAILED = "JobFailed"
    RUN_ENDED = "RunEnded"
    # The kubelet's own reasons for a container that does not start (not a capacity wait).
    ERR_IMAGE_PULL = "ErrImagePull"
    IMAGE_PULL_BACK_OFF = "ImagePullBackOff"
    INVALID_IMAGE_NAME = "InvalidImageName"
    CRASH_LOOP_BACK_OFF = "CrashLoopBackOff"
    CREATE_CONTAINER_CONFIG_ERROR = "CreateContainerConfigError"
    CREATE_CONTAINER_ERROR = "CreateContainerError"
    RUN_CONTAINER_ERROR = "RunContainerError"


# The reasons a pod's container waits that mean it will not start by waiting longer.
CONTAINER_FAILING = frozenset({
    CapacityReason.ERR_IMAGE_PULL, CapacityReason.IMAGE_PULL_BACK_OFF, CapacityReason.INVALID_IMAGE_NAME,
    CapacityReason.CRASH_LOOP_BACK_OFF, CapacityReason.CREATE_CONTAINER_CONFIG_ERROR,
    CapacityReason.CREATE_CONTAINER_ERROR, CapacityReason.RUN_CONTAINER_ERROR,
})


def gpu_tags(gpu_class: str, gpu_count: int) -> dict[str, str]:
    """The tags that say a Function or its step needs `gpu_count` GPUs of `gpu_class`.

    >>> gpu_tags("l4", 2)
    {'gpufn/gpu-class': 'l4', 'gpufn/gpu-count': '2'}
    """
    return {GPU_CLASS_TAG: gpu_class, GPU_COUNT_TAG: str(gpu_count)}


def run_gpu_tags(gpu_class: str, gpu_count: int) -> dict[str, str]:
    """The same on a run: the class shown (a user filters by it), the count kept hidden.

    >>> run_gpu_tags("l4", 2)
    {'gpufn/gpu-class': 'l4', '.dagster/gpufn-gpu-count': '2'}
    """
    return {GPU_CLASS_TAG: gpu_class, RUN_GPU_COUNT_TAG: str(gpu_count)}


# A GPU request that accepts several classes, in order of preference, names them joined by this in
# its tags, its pool and its placement's key ("h100-80gb|a100-80gb": an H100, else an A100).
CLASS_CHOICE_SEPARATOR = "|"


def class_choice(gpu_class: str) -> tuple[str, ...]:
    """The classes a GPU request (a tag's, a pool's) accepts, first choice first.

    >>> class_choice("h100-80gb|a100-80gb"), class_choice("l4")
    (('h100-80gb', 'a100-80gb'), ('l4',))
    """
    return tuple(gpu_class.split(CLASS_CHOICE_SEPARATOR))


def choice_request(names: tuple[str, ...] | list[str]) -> str:
    """The request text of classes accepted in this order (`class_choice` read back).

    >>> choice_request(["h100-80gb", "a100-80gb"]), choice_request(["l4"])
    ('h100-80gb|a100-80gb', 'l4')
    """
    return CLASS_CHOICE_SEPARATOR.join(names)


# The Dagster pool of a class's GPU steps: embedded mode limits it to the class's `local.slots`.
GPU_POOL_PREFIX = "gpu-"


def gpu_pool(gpu_class: str) -> str:
    """The Dagster pool (op concurrency key) that a GPU step of class `gpu_class` claims a slot of.

    >>> gpu_pool("l4"), pool_class("gpu-l4"), pool_class("warehouse")
    ('gpu-l4', 'l4', None)
    """
    return GPU_POOL_PREFIX + gpu_class


def pool_class(pool: str) -> str | None:
    """The GPU class whose steps claim `pool` (None for a pool that is not a GPU class's)."""
    return pool.removeprefix(GPU_POOL_PREFIX) if pool.startswith(GPU_POOL_PREFIX) else None


def time_tag(seconds: float) -> str:
    """A moment (seconds since the epoch) as a tag value a person reads: ISO 8601, UTC, whole seconds."""
    return datetime.fromtimestamp(round(seconds), timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def seconds_from_tag(value: str) -> float:
    """The moment a `time_tag` value names (runs tagged by an earlier release carry epoch seconds)."""
    try:
        return float(value)
    except ValueError:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


ENDED_WAITING = "ended"  # the wait-estimate tag of a run that ended while it waited


def waiting_since(run_tags: Mapping[str, str], now: float) -> float:
    """When a run started waiting for GPU capacity (`now` for one that has no such tag yet).

    >>> waiting_since({".dagster/gpufn-waiting-since": "2026-11-30T17:01:13Z"}, now=0.0), waiting_since({}, now=5.0)
    (1796058073.0, 5.0)
    """
    value = run_tags.get(WAITING_SINCE_TAG)
    return seconds_from_tag(value) if value else now
