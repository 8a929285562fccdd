"""Every error this project raises on purpose: one base, one subclass per cause.

Catch `GpufnError` to handle all of them; each subclass names one cause, and its message names
the file, class or Function and the field, and says what to do. Where a caller of an earlier
release caught a builtin (`ValueError` for a bad declaration, `LookupError` for a missing table),
the subclass still is one, so that code keeps working.
"""

from __future__ import annotations


class GpufnError(Exception):
    """Base of every error gpufn-dagster raises on purpose."""


# GPU classes and declarations: raised while definitions load, before anything runs.
class GpuClassError(GpufnError, ValueError):
    """One or more GPU class files are invalid; the message lists every problem (file, class, field)."""


class ClassRequestError(GpufnError, ValueError):
    """A GPU request (classes in order x GPU count) the operator's classes cannot serve. One rule
    (`class_requests.accept`) raises it; a Function's load prefixes the Function, a launch wraps it in a
    `PlacementError`, so both say the same `field` ('gpu_class' or 'gpu_count') and `problem`."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"field {field!r}: {problem}")
        self.field, self.problem = field, problem


class FunctionDefinitionError(GpufnError, ValueError):
    """A Function's declaration does not fit its table, class or callable."""


class PartitionKeyError(FunctionDefinitionError):
    """A partition key cannot be written as a filter on the Function's partition column (on an
    integer column: anything but the integer as `str(int(key))` writes it, so that no two keys
    share a slice); static keys are refused when definitions load, dynamic ones when their run starts."""


class ComponentError(FunctionDefinitionError):
    """A YAML component's attribute is invalid; the message names the `defs.yaml` file and the field."""


class UnsupportedInputType(GpufnError, TypeError):
    """An input column's Arrow type cannot be signed (so changes in it could not be detected)."""


class TableNotFound(GpufnError, LookupError):
    """A Function or view names a table the database does not have (yet)."""


# Refreshing a column.
class FunctionFailed(GpufnError, RuntimeError):
    """The Function raised on a row under on_error='fail'; the refresh stops, committed work stays."""


class FailureBudgetExceeded(FunctionFailed):
    """More rows failed than the Function's max_failed_rows / max_failed_fraction allow; the refresh
    stopped at once and committed nothing (checkpoints stay)."""


class RowTimeout(GpufnError, TimeoutError):
    """Raised inside a Function's call that ran past its row_timeout_seconds (times its rows);
    name it in an on_error rule (`Retry("RowTimeout")`, `Skip("RowTimeout")`) to retry or skip such rows."""


class UpstreamNotCurrent(GpufnError, RuntimeError):
    """An input column computed by another Function is not current for every row; nothing was computed."""


class CommitRefused(GpufnError, RuntimeError):
    """Lance refused the refresh's commit for a reason other than a concurrent writer; nothing changed."""


class CommitRacesLost(GpufnError, RuntimeError):
    """Concurrent writers of the same fragments (compaction?) won every commit race; run the refresh again."""


class RefreshStopped(GpufnError, RuntimeError):
    """A fragment's work stopped because another fragment of the same refresh failed, or the run
    was terminated (raised inside the Function's call in flight); the refresh raises that failure
    or the interrupt, never this one, and no error policy sees it."""


class PartDamaged(GpufnError, RuntimeError):
    """A checkpointed part (a chunk of rows, or a finished fragment's file) no longer matches the
    checksum it was saved with; the refresh removes it and computes its rows again."""


class LeaseLost(GpufnError, RuntimeError):
    """The refresh's lease on its column expired while held; another refresh may have taken over."""


# Placing runs.
class PlacementError(GpufnError, ValueError):
    """A run's GPU request cannot be placed (unknown class, too many GPUs, mixed classes, GPU sidecars)."""


class GpuPlacementRejected(GpufnError):
    """The launcher refused a GPU run whose request cannot be placed; no Kubernetes object was created."""


class KubernetesUnavailable(GpufnError):
    """The Kubernetes API did not answer (down, unreachable, or too slow); retrying later may help."""


class KubernetesRejected(GpufnError):
    """The Kubernetes API answered and refused the request (4xx): retrying will not help."""


# Serving.
class ApiConfigError(GpufnError, ValueError):
    """The HTTP API's own configuration is unsafe or invalid (e.g. an empty token)."""
