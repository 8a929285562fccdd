"""Adopting a killed run's parts: what a new run pays to take over a fanned-out refresh whose
shards were killed after checkpointing, against computing the same rows itself, at two table
sizes 10x apart.

Run A plans a 4-shard refresh of a trivial batch UDF (`x * 2`) over a fresh table and computes
every shard as checkpoint chunks (each call a chunk: `checkpoint_seconds=0`), then stops before
its commit, as a run killed there would. Then, each in a fresh process on its own copy of the
table, run B (a new run: another lease token, told run A ended) plans, computes its 4 shards and
commits:

- `adopt`: over A's parts -- a listing, a read and a SHA-256 of each chunk, no call of the Function;
- `recompute`: over the same table without them -- every row computed (what B would pay without
  adoption, or with every checksum failing).

Process CPU seconds (every thread) beside wall seconds; medians of `--repeat` interleaved runs.

    .venv/bin/python bench/adopt_bench.py --rows 2000000 --small-rows 200000 --repeat 3

Prints a Markdown table (paste into BENCHMARKS.md) and writes bench/results/adopt.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from refresh_bench import cpu_seconds, double_x, make_table  # noqa: E402

BATCH_ROWS = 65_536
WORKERS = 4


def _function():
    import pyarrow as pa

    from gpufn_dagster.function_spec.functions import make_function

    return make_function(double_x, table="t", column="y", output_type=pa.int64(), batch_size=BATCH_ROWS,
                         adapt_batch_size=False,
                         checkpoint_seconds=0)


def _column(uri: str, token: str):
    from gpufn_dagster.refresh.engine import ColumnRefresh, RefreshOptions
    from gpufn_dagster.refresh.files import TableFiles

    return ColumnRefresh(TableFiles(f"{uri}/t.lance"), _function(),
                         RefreshOptions(lease_token=token, lease_holder_ended=lambda other: True))


def killed_run(uri: str) -> int:
    """Run A: plan and every shard, no commit. Returns the parts it saved."""
    from gpufn_dagster.refresh.files import TableFiles

    column = _column(uri, "run-a")
    plan = column.plan(WORKERS)
    for shard in plan.shards:
        column.compute_shard(shard, plan.read_version)
    return sum(name.endswith(".arrow") for name in TableFiles(f"{uri}/t.lance").names("_gpufn/checkpoints"))


def new_run(uri: str) -> dict:
    """Run B, in this process: plan, 4 shards, commit; its figures and process CPU."""
    import time

    import gpufn_dagster.refresh.engine  # noqa: F401 -- imports are not the run's work

    _function()
    began_cpu, began = cpu_seconds(), time.perf_counter()
    column = _column(uri, "run-b")
    plan = column.plan(WORKERS)
    shards = [column.compute_shard(shard, plan.read_version) for shard in plan.shards]
    result = column.commit_shards()
    return {"wall_s": time.perf_counter() - began, "cpu_s": cpu_seconds() - began_cpu,
            "rows_computed": sum(s.rows_computed for s in shards), "rows_adopted": sum(s.rows_adopted for s in shards),
            "parts_adopted": sum(s.parts_adopted for s in shards), "rows_total": result.rows_total}


def child(uri: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", uri], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--small-rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(new_run(args.child)))
        return
    work = Path(tempfile.mkdtemp(prefix="gpufn-adopt-"))
    rows_out = []
    try:
        for rows in (args.small_rows, args.rows):
            plain, killed = work / f"plain-{rows}", work / f"killed-{rows}"
            make_table(str(plain), rows)
            shutil.copytree(plain, killed)
            parts = killed_run(str(killed))
            runs: dict[str, list[dict]] = {"adopt": [], "recompute": []}
            for _ in range(args.repeat):
                for case, base in (("adopt", killed), ("recompute", plain)):
                    copy = work / f"copy-{case}"
                    shutil.copytree(base, copy)
                    runs[case].append(child(str(copy)))
                    shutil.rmtree(copy)
            for case, measured in runs.items():
                assert all(m["rows_total"] == rows for m in measured)
                rows_out.append({"rows": rows, "case": case, "parts_saved": parts,
                                 **{k: statistics.median(m[k] for m in measured)
                                    for k in ("wall_s", "cpu_s", "rows_computed", "rows_adopted", "parts_adopted")}})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    by = {(r["rows"], r["case"]): r for r in rows_out}
    print("| table rows | case | parts adopted | rows computed | wall s | CPU s | CPU ÷ recompute | CPU ÷ same case 10x smaller |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows_out:
        smaller = by.get((args.small_rows, r["case"])) if r["rows"] == args.rows else None
        growth = f"{r['cpu_s'] / smaller['cpu_s']:.2f}" if smaller else "-"
        print(f"| {r['rows']:,} | {r['case']} | {r['parts_adopted']:,.0f} | {r['rows_computed']:,.0f} | "
              f"{r['wall_s']:.3f} | {r['cpu_s']:.3f} | {r['cpu_s'] / by[(r['rows'], 'recompute')]['cpu_s']:.2f} | {growth} |")
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "adopt.json").write_text(json.dumps(rows_out, indent=2))


if __name__ == "__main__":
    main()
