"""Reading a fragment for the model: in windows that yield their first rows at once, cut into calls.

One Lance scan of a whole fragment decodes much of it before its first batch (a quarter of a
second for 256 MB), while the model waits; a window (`offset`/`limit`, counted in live rows)
yields its first batch at once. Windows grow 4x at a time up to READ_WINDOW_BYTES of data (or
one call, when larger), so narrow rows still come in a few large scans and a wide row's window
never stalls the model for long. Reads are as large as the calls (at least READ_ROWS rows: small
reads cost more than their rows), so a call is a slice of one read; only a call that spans reads
joins them, a copy.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator

import lance
import numpy as np
import pyarrow as pa

from ..errors import RefreshStopped

ADDRESS = "_rowaddr"
ROW_ID = "_rowid"  # the stable row id, read beside the address to name a failing row
READ_ROWS = 1024  # the fewest rows read at once: a read costs ~40 us whatever its rows
READ_WINDOW_BYTES = 16 << 20  # the most data one scan window covers
_OFFSET_MASK = 0xFFFFFFFF  # Lance addresses a row as `fragment id << 32 | physical offset`


def split_address(address: int) -> tuple[int, int]:
    """(fragment id, physical offset) of one row address.

    >>> split_address(4294969296)
    (1, 2000)
    """
    return address >> 32, address & _OFFSET_MASK


def row_offsets(addresses: np.ndarray) -> np.ndarray:
    """The physical offsets (int64) of row addresses in their fragment.

    >>> row_offsets(np.array([4294969296, 5], dtype=np.uint64)).tolist()
    [2000, 5]
    """
    return (addresses & _OFFSET_MASK).astype(np.int64)


def live_offset(fragment: lance.LanceFragment, physical: int) -> int:
    """How many live rows come before physical row `physical`: where a scan starting there begins
    (scans count offsets in live rows). Reads only the row addresses, and only when rows were deleted."""
    return live_counter(fragment)(physical)


def live_counter(fragment: lance.LanceFragment) -> Callable[[int], int]:
    """`live_offset` of one fragment for many physical rows: its row addresses are read once, at
    the first call, and only when rows were deleted."""
    if fragment.metadata.deletion_file is None:
        physical_rows = fragment.metadata.physical_rows
        return lambda physical: max(0, min(physical, physical_rows))
    offsets: list[np.ndarray] = []

    def count(physical: int) -> int:
        if physical <= 0:
            return 0
        if not offsets:
            addresses = fragment.scanner(columns=[], with_row_address=True).to_table().column(ADDRESS).to_numpy()
            offsets.append(row_offsets(addresses))
        return int(np.searchsorted(offsets[0], physical))

    return count


def read_windows(fragment: lance.LanceFragment, columns: dict[str, str], read_rows: Callable[[], int],
                 stop: threading.Event, offset: int = 0) -> Iterator[pa.RecordBatch]:
    """The fragment's live rows from live row `offset` on, with their row addresses, window by
    window, in reads of `read_rows()` rows (asked anew for each window: the calls' size, so a call
    is one read's slice, not a copy joining reads); raises RefreshStopped once `stop` is set."""
    window = read = max(READ_ROWS, read_rows())
    while True:
        got = nbytes = 0
        for batch in fragment.scanner(columns=columns, batch_size=read,
                                      with_row_address=True, with_row_id=True, offset=offset,
                                      limit=window).to_batches():
            if stop.is_set():
                raise RefreshStopped
            got += batch.num_rows
            nbytes += batch.nbytes
            yield batch
        if got < window:
            return
        offset += got
        read = max(READ_ROWS, read_rows())
        # A whole number of reads: the next window starts where a call starts.
        window = max(read, min(window * 4, int(READ_WINDOW_BYTES * got / max(nbytes, 1))) // read * read)


def cut_calls(reads: Iterator[pa.RecordBatch], call_rows: Callable[[], int], start: int = 0,
              end: int | None = None, counted: np.ndarray | None = None) -> Iterator[pa.RecordBatch]:
    """The rows at physical offsets [start, end) in calls of `call_rows()` rows (asked anew for each call).

    `counted`: the sorted physical offsets of the rows a call's size counts (a slice's rows, the only
    ones the model gets); a call then holds `call_rows()` of them and the other rows around them,
    at most SPAN_ROWS rows in all (or `call_rows()`, when larger), so rows of other slices neither
    shrink the model's calls nor fill memory. A call of any size waits for as many reads as it needs.

    >>> reads = iter([pa.record_batch({ADDRESS: pa.array(range(10), pa.uint64())})])
    >>> [c.column(ADDRESS).to_pylist() for c in cut_calls(reads, lambda: 3, start=2, end=8)]
    [[2, 3, 4], [5, 6, 7]]
    >>> reads = iter([pa.record_batch({ADDRESS: pa.array(range(10), pa.uint64())})])
    >>> [c.column(ADDRESS).to_pylist() for c in cut_calls(reads, lambda: 2, counted=np.array([1, 4, 5, 9]))]
    [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]]
    """
    buffered: deque[pa.RecordBatch] = deque()
    weights: deque[np.ndarray] = deque()  # per buffered batch, whether each row counts (with `counted`)
    rows = 0  # counted rows buffered
    span = 0  # rows buffered
    for batch in reads:
        if not batch.num_rows:
            continue
        addresses = batch.column(ADDRESS).to_numpy()
        head, tail = (int(a) & _OFFSET_MASK for a in (addresses[0], addresses[-1]))
        # The offsets of every row only where the range cuts the read (or a slice's rows count).
        offsets = row_offsets(addresses) if head < start or (end is not None and tail >= end) or counted is not None \
            else None
        first = int(np.searchsorted(offsets, start)) if head < start else 0
        last = int(np.searchsorted(offsets, end)) if end is not None and tail >= end else len(addresses)
        batch = batch.slice(first, last - first)
        if batch.num_rows:
            buffered.append(batch)
            span += batch.num_rows
            if counted is None:
                rows += batch.num_rows
            else:
                weight = np.isin(offsets[first:last], counted, assume_unique=True)
                weights.append(weight)
                rows += int(np.count_nonzero(weight))
        while buffered and (size := _call_size(call_rows(), rows, span, None if counted is None else weights,
                                               buffered[0].num_rows)):
            call = _take(buffered, size)
            rows -= call.num_rows if counted is None else _drop_weights(weights, call.num_rows)
            span -= call.num_rows
            yield call
        if last < len(addresses):
            break  # past the end: read no further
    if span:
        yield _take(buffered, span)


SPAN_ROWS = 64 * READ_ROWS  # the most rows one call spans when only some of them count (`cut_calls`)


def _call_size(wanted: int, rows: int, span: int, weights: deque[np.ndarray] | None, head: int) -> int:
    """How many buffered rows the next call takes, 0 while it must read on: `wanted` counted rows
    (`rows` of them buffered among `span` rows; `weights` say which count, None: all), or fewer
    counted rows once max(SPAN_ROWS, wanted) rows are buffered. A call is never cut at SPAN_ROWS
    when every row counts: a `batch_size` above it gets calls of its size.

    When every row counts and the first buffered read (`head` rows) holds at least half of a call
    that would span reads, the call is that read alone: joining reads copies every row, and after
    one such call the reads start where calls start again (reads are as large as calls).

    >>> _call_size(262_144, 65_536, 65_536, None, 65_536), _call_size(262_144, 262_144, 262_144, None, 262_144)
    (0, 262144)
    >>> _call_size(262_144, 300_000, 300_000, None, 200_000), _call_size(262_144, 300_000, 300_000, None, 100_000)
    (200000, 262144)
    >>> _call_size(4, 1, SPAN_ROWS, deque([np.array([True] + [False] * (SPAN_ROWS - 1))]), SPAN_ROWS)
    65536
    """
    most = max(SPAN_ROWS, wanted)
    if rows < wanted and span < most:
        return 0
    if weights is None:
        return head if wanted // 2 <= head < wanted else wanted
    return _counted_prefix(weights, wanted, most)


def _counted_prefix(weights: deque[np.ndarray], wanted: int, most: int) -> int:
    """How many buffered rows hold the first `wanted` counted rows (at most `most` rows, at most all)."""
    seen = taken = 0
    for weight in weights:
        cumulative = np.cumsum(weight)
        if seen + (cumulative[-1] if len(cumulative) else 0) >= wanted:
            return min(taken + int(np.searchsorted(cumulative, wanted - seen)) + 1, most)
        seen += int(cumulative[-1]) if len(cumulative) else 0
        taken += len(weight)
        if taken >= most:
            return most
    return taken


def _drop_weights(weights: deque[np.ndarray], rows: int) -> int:
    """Remove the first `rows` rows' weights; returns how many of them counted."""
    dropped = 0
    while rows:
        head = weights.popleft()
        if len(head) > rows:
            weights.appendleft(head[rows:])
            head = head[:rows]
        dropped += int(np.count_nonzero(head))
        rows -= len(head)
    return dropped


def _take(buffered: deque[pa.RecordBatch], rows: int) -> pa.RecordBatch:
    """The first `rows` rows of the buffered batches, removed from it (slices: no copy unless spanning).

    >>> from collections import deque
    >>> buffered = deque([pa.record_batch({"x": [1, 2, 3]}), pa.record_batch({"x": [4, 5]})])
    >>> _take(buffered, 4).column("x").to_pylist(), [b.num_rows for b in buffered]
    ([1, 2, 3, 4], [1])
    """
    parts = []
    while rows:
        head = buffered.popleft()
        if head.num_rows > rows:
            buffered.appendleft(head.slice(rows))
            head = head.slice(0, rows)
        parts.append(head)
        rows -= head.num_rows
    return parts[0] if len(parts) == 1 else pa.concat_batches(parts)
