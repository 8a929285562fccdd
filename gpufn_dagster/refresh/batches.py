"""How many rows the Function's next call takes: a small probe first, then toward a target time per call.

The first call is small (`batch_size`, the probe), so a refresh's first values -- and its first
errors -- show within seconds, even for a model that is slow per row. Each finished call tells the
rate (rows per second inside the Function); the next calls aim at `target_seconds` per call from
that rate, moving at most `growth` times up or down per step, never below the probe, never above
`maximum`, and never above the rows that fit in device memory after an out-of-memory split. The
same rule as LanceDB Enterprise's adaptive execution (probe, grow toward a target duration by a
bounded factor), applied to the model's calls. A pinned size (`adapt=False`) never moves, except
down to what fits.
"""

from __future__ import annotations

from dataclasses import dataclass, field

TARGET_SECONDS = 1.0  # long enough to keep a GPU's kernels full, short enough to show progress often
GROWTH = 4.0  # the most one step may grow (or shrink) the calls


@dataclass
class BatchSizer:
    """The rows of the next call; `observe` each finished call.

    Example:
        >>> sizer = BatchSizer(start=64, maximum=4096)
        >>> sizer.rows
        64
        >>> sizer.observe(rows=64, seconds=0.01)  # 6,400 rows/s would fill 1 s with 6,400 rows: 4x at most
        >>> sizer.rows
        256
        >>> sizer.observe(rows=256, seconds=0.04); sizer.rows, sizer.largest
        (1024, 1024)
        >>> sizer.observe(rows=1024, seconds=4.0)  # slower than the target: shrink toward 256 rows
        >>> sizer.rows
        256
        >>> sizer.observe(rows=256, seconds=0.01, fits=100)  # an out-of-memory split: 100 rows fit
        >>> sizer.rows
        100
        >>> pinned = BatchSizer(start=64, maximum=4096, adapt=False)
        >>> pinned.observe(rows=64, seconds=0.001); pinned.rows
        64
    """

    start: int
    maximum: int  # at least `start` (make_function resolves max_batch_size so)
    adapt: bool = True
    target_seconds: float = TARGET_SECONDS
    rows: int = field(init=False)
    largest: int = field(init=False)  # the most rows it asked for so far (reported in the metadata)

    def __post_init__(self) -> None:
        self.rows = self.largest = self.start

    def observe(self, rows: int, seconds: float, fits: int | None = None) -> None:
        """A call of `rows` rows took `seconds` inside the Function; `fits`: the rows known to fit in memory."""
        wanted = self.rows
        if self.adapt and rows > 0 and seconds > 0:
            ideal = rows / seconds * self.target_seconds
            wanted = int(min(max(ideal, self.rows / GROWTH), self.rows * GROWTH))
            wanted = min(max(wanted, self.start), self.maximum)
        if fits is not None:
            wanted = min(wanted, fits)
        self.rows = max(wanted, 1)
        self.largest = max(self.largest, self.rows)
