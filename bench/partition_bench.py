"""Partitions: planning one partition of a large table, and a backfill of every partition against one
unpartitioned refresh of the same rows with the same Function, side by side in one session.

The table: `--rows` rows (default 10 M) with a `day` column of `--days` daily partitions (default
365), either bulk-loaded (fragments of 1 M rows, each holding rows of ~37 days: every partition
shares its fragments with others) or appended a day at a time (one fragment per day). The
Function is cheap (`x * 2` on an Arrow array), so what is measured is the engine, not a model.

1. Planning one partition (`plan_fragments(where=...)`): its time, and the rows and bytes Lance
   read for it (from Lance's own scan metrics), without and with a BTREE index on `day`, next to
   the unpartitioned plan (fragment metadata only).
2. Refreshing every partition one after another (a backfill's runs, minus Dagster's run start)
   against one refresh of the whole column: wall time and rows/s, and their ratio.

    .venv/bin/python bench/partition_bench.py --rows 10000000 --days 365
"""

from __future__ import annotations

import argparse
import re
import statistics
import tempfile
import time

import lance
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gpufn_dagster import make_function
from gpufn_dagster.function_spec.partitions import Partitioning
from gpufn_dagster.refresh.columns import ensure_columns
from gpufn_dagster.refresh.engine import ColumnRefresh, RefreshOptions
from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.refresh.plan import plan_fragments
from gpufn_dagster.refresh.state import load_state

FIRST_DAY = np.datetime64("2025-01-01")


def doubled(x: pa.Array) -> pa.Array:
    return pc.multiply(x, 2)


def make_table(uri: str, rows: int, days: int, layout: str) -> None:
    """`rows` rows spread evenly over `days` days, bulk-loaded or appended a day at a time."""
    day_of = (np.arange(rows, dtype=np.int64) * days // rows)
    day = (FIRST_DAY + day_of.astype("timedelta64[D]")).astype("datetime64[D]")
    table = pa.table({"x": np.arange(rows, dtype=np.int64), "day": pa.array(day, pa.date32())})
    if layout == "bulk":
        lance.write_dataset(table, uri, max_rows_per_file=1_000_000, enable_stable_row_ids=True)
        return
    starts = np.searchsorted(day_of, np.arange(days + 1))
    for i in range(days):
        lance.write_dataset(table.slice(starts[i], starts[i + 1] - starts[i]), uri,
                            mode="create" if i == 0 else "append", enable_stable_row_ids=True)


def scan_metrics(dataset: lance.LanceDataset, where: str) -> tuple[int, int]:
    """(rows scanned, bytes read) of the plan's one scan, as Lance's metrics count them."""
    text = dataset.scanner(filter=where, columns=[], with_row_address=True).analyze_plan()
    read = re.search(r"LanceRead:.*?rows_scanned=([\d.]+ ?[KMG]?).*?bytes_read=([\d.]+ ?[KMG]?B?)", text)

    def number(value: str) -> int:
        value = value.replace("B", "").strip()
        scale = {"K": 1e3, "M": 1e6, "G": 1e9}.get(value[-1:], 1)
        return int(float(value.rstrip("KMG ").strip()) * scale)

    return (number(read[1]), number(read[2])) if read else (-1, -1)


def timed(fn, repeat: int = 5) -> float:
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--days", type=int, default=365)
    parser.add_argument("--layouts", default="bulk,daily")
    args = parser.parse_args()
    import dagster as dg

    end = str(FIRST_DAY + np.timedelta64(args.days, "D"))
    partitions = dg.DailyPartitionsDefinition(start_date=str(FIRST_DAY), end_date=end)
    partitioning = Partitioning(partitions, "day")
    keys = partitions.get_partition_keys()
    assert len(keys) == args.days, (len(keys), args.days)
    function = make_function(doubled, table="t", column="y", inputs=["x"], output_type=pa.int64())
    types = {"day": pa.date32()}
    for layout in args.layouts.split(","):
        root = tempfile.mkdtemp(prefix="gpufn-partition-bench-")
        made = time.perf_counter()
        make_table(f"{root}/t.lance", args.rows, args.days, layout)
        files = TableFiles(f"{root}/t.lance")
        dataset = ensure_columns(files, function)  # the column declared, as a refresh's plan finds it
        print(f"\n== layout {layout}: {args.rows:,} rows, {args.days} days, {len(dataset.get_fragments())} fragments "
              f"(made in {time.perf_counter() - made:.1f}s)")
        middle = partitioning.where([keys[len(keys) // 2]], types)
        state = load_state(files, function.sig_column)
        whole = timed(lambda: plan_fragments(dataset, function, state))
        sliced = timed(lambda: plan_fragments(dataset, function, state, where=middle))
        rows, read = scan_metrics(dataset, middle)
        print(f"plan, whole column (metadata only): {whole * 1000:.1f} ms")
        print(f"plan, one partition, no index:      {sliced * 1000:.1f} ms; Lance scanned {rows:,} rows, read "
              f"{read:,} bytes")
        dataset.create_scalar_index("day", "BTREE")
        dataset = files.dataset()
        indexed = timed(lambda: plan_fragments(dataset, function, state, where=middle))
        rows, read = scan_metrics(dataset, middle)
        print(f"plan, one partition, BTREE on day:  {indexed * 1000:.1f} ms; Lance scanned {rows:,} rows, read "
              f"{read:,} bytes")

        # every partition, one after another, then the same rows as one refresh of a fresh copy
        started = time.perf_counter()
        computed = 0
        for key in keys:
            computed += ColumnRefresh(files, function, RefreshOptions(where=partitioning.where([key], types))
                                      ).refresh().rows_computed
        partitioned = time.perf_counter() - started
        assert computed == args.rows, (computed, args.rows)
        copy = f"{root}/whole.lance"
        make_table(copy, args.rows, args.days, layout)
        started = time.perf_counter()
        assert ColumnRefresh(TableFiles(copy), function).refresh().rows_computed == args.rows
        one = time.perf_counter() - started
        print(f"{len(keys)} partition refreshes: {partitioned:.1f} s ({args.rows / partitioned:,.0f} rows/s); one "
              f"refresh of the column: {one:.1f} s ({args.rows / one:,.0f} rows/s); partitions / one = "
              f"{partitioned / one:.2f}")


if __name__ == "__main__":
    main()
