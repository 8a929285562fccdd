"""What the fragment workers of one refresh verb share across its attempts (a commit race re-plans
on a newer table version and starts a new attempt): the Function's loaded instance, its
checkpoints and the data files it wrote, and what earlier calls taught the batch sizes.

The instance is loaded once per verb, on the first call that needs it -- never for a refresh
with no stale row -- and closed when the verb ends.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa

from ..errors import RefreshStopped
from ..function_spec.functions import Function
from .batches import BatchSizer
from .checkpoint import CheckpointStore
from .deadline import raise_in
from .execute import BatchFit, RowError, Rows, call_function
from .files import TableFiles
from .leftovers import WrittenFiles
from .progress import Progress


@contextmanager
def loading(progress: Progress, report: Callable[[Progress], None] | None) -> Iterator[None]:
    """Time the block as the Function's loading (`load_seconds`), said in the run log as it starts
    and ends, so that a model's load never counts as computing."""
    progress.loading_since = time.monotonic()
    if report:
        report(progress)
    try:
        yield
    finally:
        progress.load_seconds += time.monotonic() - progress.loading_since
        progress.loading_since = None
        if report:
            report(progress)


class FunctionInstance:
    """The Function's callable (a class loads its model when constructed), built on the first call
    that needs it and kept for every attempt of one refresh verb, then closed once.

    Loading is timed apart from the rows and said in the run log as it starts and ends, so a model
    that loads for a minute never reads as a minute of computing. `embedded.warm.WarmInstance` is
    the same seam with the instance kept in a process of its own that outlives the step.
    """

    def __init__(self, function: Function):
        self.function = function
        self._call: Any = None

    def ready(self, progress: Progress, report: Callable[[Progress], None] | None) -> None:
        """Load the instance now if this is its first use (call with the model thread's lock held)."""
        if self._call is None:
            with loading(progress, report):
                self._call = self.function.open()

    def call(self, inputs: pa.RecordBatch, rows: Rows, fit: BatchFit) -> tuple[pa.Array, list[RowError]]:
        """Values for the rows of one call and the rows that failed (`execute.call_function`)."""
        return call_function(self._call, self.function, inputs, rows, fit)

    def interrupt(self, thread: int) -> None:
        """Stop the call in flight on `thread` (the run was terminated): `RefreshStopped` is raised
        inside it at its next Python instruction (`deadline.raise_in`)."""
        raise_in(thread, RefreshStopped)

    def close(self) -> None:
        """Release what the callable holds (its `close()`, when it has one)."""
        if self._call is not None and hasattr(self._call, "close"):
            self._call.close()


# Where a refresh gets its Function's instance: a FunctionInstance of its own, by default.
InstanceSource = Callable[[Function], FunctionInstance]


@dataclass
class Worker:
    """What every attempt of one refresh verb shares: the table's files, the Function, its checkpoints
    and the data files it wrote, its loaded instance, and what earlier calls taught the batch sizes."""

    files: TableFiles
    function: Function
    store: CheckpointStore
    written: WrittenFiles
    instance: FunctionInstance
    fit: BatchFit
    sizer: BatchSizer
    prefetch: int
    report: Callable[[Progress], None] | None
    # Who this refresh verb is, written into its checkpoints: rows restored from a checkpoint another
    # token wrote (a killed run's) are adopted, not computed by this verb (`fragments.Outcome`).
    token: str = field(default_factory=lambda: uuid.uuid4().hex)
    # The addresses of the rows given a value, when the caller counts them per slice (None: not kept).
    computed_rows: list[np.ndarray] | None = None

    @classmethod
    def of(cls, files: TableFiles, function: Function, prefetch: int,
           report: Callable[[Progress], None] | None, instances: InstanceSource = FunctionInstance,
           scope: str | None = None, keep_rows: bool = False) -> Worker:
        """`scope`: where its checkpoints and written files live (`slices.scope`; default the column's);
        `keep_rows`: keep the addresses of the rows it computes (`computed_rows`)."""
        scope = scope or function.sig_column
        return cls(files, function, CheckpointStore(files, scope, function.version),
                   WrittenFiles(files, scope), instances(function), BatchFit(),
                   BatchSizer(function.batch_size, function.max_batch_size, adapt=function.options.adapt_batch_size),
                   prefetch, report, computed_rows=[] if keep_rows else None)
