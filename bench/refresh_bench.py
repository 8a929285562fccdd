"""Column refresh, side by side on one table: gpufn's refresh with a trivial Python UDF, lancedb's
native SQL computed column (`add_columns(computed=...)` + `refresh_column`), and pylance
`add_columns` with a batch UDF; then incremental refresh after a 1 % append vs a full refresh,
and peak RSS at two table sizes. Each measurement runs in a fresh process (so peak RSS is its
own) on a fresh copy of the table, and reports process CPU seconds (every thread, Lance's too)
beside wall seconds: on a shared machine wall time tracks the load, CPU seconds do not. Cases are
interleaved `--repeat` times and the table gives medians, with CPU ratios against lancedb's SQL
refresh and pylance in the same run.

    .venv/bin/python bench/refresh_bench.py --rows 5000000 --small-rows 500000 --repeat 5

Prints a Markdown table (paste into BENCHMARKS.md) and writes bench/results/refresh.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

HERE = Path(__file__).resolve().parent
# Rows per call of the batch UDF; a trivial vectorized UDF is best called with large batches.
BATCH_ROWS = 262_144


def make_table(uri: str, rows: int) -> None:
    import lancedb
    import numpy as np
    import pyarrow as pa

    db = lancedb.connect(uri)
    chunk = 1_000_000

    def batches():
        for start in range(0, rows, chunk):
            n = min(chunk, rows - start)
            yield pa.record_batch({"id": pa.array(np.arange(start, start + n)),
                                   "x": pa.array(np.random.default_rng(start).integers(0, 1_000_000, n))})

    schema = pa.schema([("id", pa.int64()), ("x", pa.int64())])
    db.create_table("t", pa.RecordBatchReader.from_batches(schema, batches()),
                    storage_options={"new_table_enable_stable_row_ids": "true"})


def double_x(x: pa.Array) -> pa.Array:
    """The trivial Python UDF, batch form (pyarrow.Array in, pyarrow.Array out)."""
    return pc.multiply(x, 2)


def double_row(x: int) -> int:
    """The same UDF called per row."""
    return x * 2


def cpu_seconds() -> float:
    """User + system CPU seconds of this process, all its threads (Lance's and Arrow's pools included):
    on a shared machine wall time tracks the load, CPU seconds do not."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_case(case: str, uri: str) -> dict:
    """Runs in a child process: one measurement, with its own peak RSS."""
    import resource

    import lance
    import lancedb

    from gpufn_dagster import make_function, refresh_column

    table = lancedb.connect(uri).open_table("t")
    table_uri = table.to_lance().uri
    started = time.perf_counter()
    cpu_started = cpu_seconds()
    rows = table.count_rows()
    detail = {}
    if case in ("gpufn", "gpufn_incremental"):
        result = refresh_column(table_uri, make_function(double_x, table="t", column="y_gpufn",
                                                         output_type=pa.int64(), batch_size=BATCH_ROWS))
        detail = {"rows_computed": result.rows_computed}
    elif case == "gpufn_rows":
        result = refresh_column(table_uri, make_function(double_row, table="t", column="y_rows", batch_size=65536))
        detail = {"rows_computed": result.rows_computed}
    elif case == "lancedb_sql":
        table.add_columns(computed={"y_sql": "x * 2"})
        detail = {"rows_filled": table.refresh_column("y_sql").rows_filled}
    elif case == "pylance_udf":
        ds = lance.dataset(table_uri)

        @lance.batch_udf(output_schema=pa.schema([("y_pylance", pa.int64())]))
        def udf(batch: pa.RecordBatch) -> pa.RecordBatch:
            return pa.record_batch([double_x(batch["x"])], names=["y_pylance"])

        ds.add_columns(udf, read_columns=["x"])
    else:
        raise ValueError(case)
    seconds = time.perf_counter() - started
    cpu = cpu_seconds() - cpu_started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"case": case, "rows": rows, "seconds": seconds, "cpu_seconds": cpu,
            "cpu_us_per_row": cpu / rows * 1e6, "rows_per_s": rows / seconds, "peak_rss_mib": peak,
            **detail}


def child(case: str, uri: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", case, uri], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def append_percent(uri: str, percent: float) -> int:
    import lancedb
    import numpy as np
    import pyarrow as pa

    table = lancedb.connect(uri).open_table("t")
    rows = table.count_rows()
    n = int(rows * percent / 100)
    table.add(pa.table({"id": np.arange(rows, rows + n), "x": np.arange(n)}))
    return n


CASES = ("lancedb_sql", "pylance_udf", "gpufn", "gpufn_rows")


def measure(base: str, work: Path, case: str) -> dict:
    """One case on a fresh copy of the table (every case fills its column from nothing); the
    incremental case fills the column, appends 1 %, then measures only the second refresh."""
    uri = str(work / "db")
    shutil.rmtree(uri, ignore_errors=True)
    shutil.copytree(base, uri)
    if case != "gpufn_incremental":
        return child(case, uri)
    child("gpufn", uri)
    appended = append_percent(uri, 1)
    return {"appended": appended, **child(case, uri)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--small-rows", type=int, default=1_000_000)
    parser.add_argument("--repeat", type=int, default=5,
                        help="runs of each case, interleaved; the table gives their medians")
    parser.add_argument("--child", nargs=2)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(run_case(*args.child)))
        return
    runs = []
    work = Path(tempfile.mkdtemp(prefix="gpufn-bench-"))
    try:
        for rows in (args.small_rows, args.rows):
            base = str(work / f"base{rows}")
            make_table(base, rows)
            for _ in range(args.repeat):  # interleaved, so a change of load touches every case alike
                for case in (*CASES, "gpufn_incremental"):
                    runs.append({"table_rows": rows, **measure(base, work, case)})
                    print(json.dumps(runs[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results = []
    for rows in (args.small_rows, args.rows):
        for case in (*CASES, "gpufn_incremental"):
            mine = [r for r in runs if r["table_rows"] == rows and r["case"] == case]
            results.append({"table_rows": rows, "case": case, "runs": len(mine),
                            **{k: statistics.median([r[k] for r in mine]) for k in
                               ("seconds", "cpu_seconds", "cpu_us_per_row", "rows_per_s", "peak_rss_mib")}})
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "refresh.json").write_text(json.dumps({"medians": results, "runs": runs}, indent=2))
    print("| table rows | case | wall s | CPU s | CPU us/row | CPU ÷ lancedb_sql | CPU ÷ pylance_udf | peak RSS MiB |\n"
          "| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        same = {x["case"]: x["cpu_seconds"] for x in results if x["table_rows"] == r["table_rows"]}
        print(f"| {r['table_rows']:,} | {r['case']} | {r['seconds']:.3f} | {r['cpu_seconds']:.3f} | "
              f"{r['cpu_us_per_row']:.3f} | {r['cpu_seconds'] / same['lancedb_sql']:.2f} | "
              f"{r['cpu_seconds'] / same['pylance_udf']:.2f} | {r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
