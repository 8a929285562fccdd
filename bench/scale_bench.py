"""Planning and committing at 100 M rows on object storage (issue 41 item 1), at two sizes 10x apart.

Each size is a table of cheap columns (`id`, `x`: int64) on SeaweedFS through its S3 API, written
in fragments of `--fragment-rows` rows (100,000: 100 fragments at 10 M rows, 1,000 at 100 M), and
a trivial batch Function (`x * 2`) over it, refreshed as a fanned-out run does it:
`ColumnRefresh.plan(workers=64)`, each shard's `compute_shard`, then `commit_shards`. Measured,
each in a fresh process so its CPU and memory are its own (imports excluded):

- `plan, first fill`: the plan of a column no row of which is computed (every fragment new);
- `commit of 64 shards`: joining what 64 shards computed and committing it (whole fragments a
  shard computed are finished files, verified by a HEAD; the fragments cut between two shards
  are joined from their chunks);
- `plan after 0.1 % appended`: rows appended as a new fragment, every other row current;
- `plan after 1 % changed`: `x` updated in 1 % of the rows, spread over every fragment (Lance
  moves them into a new fragment and marks them deleted where they were).

Each figure is wall and process CPU seconds (every thread) and the plan's peak memory: the
largest resident set sampled every 2 ms while it ran, minus the resident set just before it.
The 64 shards' computing is timed too, in this process, for scale (not a target).

    .venv/bin/python bench/scale_bench.py --rows 100000000 --small-rows 10000000 --fragment-rows 100000

Prints a Markdown table (paste into BENCHMARKS.md) and writes bench/results/scale.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from refresh_bench import cpu_seconds, double_x  # noqa: E402

WORKERS = 64
BATCH_ROWS = 65_536


def _column(uri: str, options: dict[str, str], token: str):
    import pyarrow as pa

    from gpufn_dagster.function_spec.functions import make_function
    from gpufn_dagster.refresh.engine import ColumnRefresh, RefreshOptions
    from gpufn_dagster.refresh.files import TableFiles

    function = make_function(double_x, table="t", column="y", output_type=pa.int64(), batch_size=BATCH_ROWS,
                             adapt_batch_size=False)
    # each step's process is gone when the next starts: the plan's lease is taken over at once
    return ColumnRefresh(TableFiles(uri, options), function,
                         RefreshOptions(lease_token=token, lease_holder_ended=lambda other: True))


def _rss() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakMemory:
    """The largest resident set seen while inside, sampled every 2 ms, above the one at entry."""

    def __enter__(self) -> PeakMemory:
        self.before = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.002):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def above_mb(self) -> float:
        return (self.peak - self.before) / 2**20


def step(verb: str, uri: str, options: dict[str, str], token: str) -> dict:
    """One verb in this (fresh) process: its wall, CPU and peak memory, and what it did."""
    column = _column(uri, options, token)
    column.files.dataset()  # opening the table once is every step's start, not the plan's growth
    began_cpu, began = cpu_seconds(), time.perf_counter()
    with PeakMemory() as memory:
        if verb == "plan":
            plan = column.plan(WORKERS)
            did = {"fragments_planned": plan.fragments, "rows_planned": plan.rows, "shards": len(plan.shards)}
        else:
            result = column.commit_shards()
            did = {"fragments_rewritten": result.fragments_rewritten, "rows_total": result.rows_total,
                   "parts_adopted": result.parts_adopted}
    return {"wall_s": time.perf_counter() - began, "cpu_s": cpu_seconds() - began_cpu,
            "peak_mb": memory.above_mb, **did}


def child(verb: str, uri: str, options: dict[str, str], token: str) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps([verb, uri, options, token])],
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{verb} failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(uri: str, options: dict[str, str], rows: int, fragment_rows: int, start: int = 0, mode: str = "create"):
    import lance
    import numpy as np
    import pyarrow as pa

    schema = pa.schema([("id", pa.int64()), ("x", pa.int64())])

    def batches():
        for at in range(start, start + rows, 1_000_000):
            n = min(1_000_000, start + rows - at)
            yield pa.record_batch({"id": pa.array(np.arange(at, at + n)),
                                   "x": pa.array(np.random.default_rng(at).integers(0, 1_000_000, n))}, schema=schema)

    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()), uri, mode=mode,
                        max_rows_per_file=fragment_rows, storage_options=options)


def one_size(store, rows: int, fragment_rows: int) -> dict:
    import lance

    uri, options = store.uri(f"scale-{rows}") + "/t.lance", store.storage_options
    out: dict = {"rows": rows}
    began = time.perf_counter()
    build(uri, options, rows, fragment_rows)
    out["fragments"] = len(lance.dataset(uri, storage_options=options).get_fragments())
    out["build_wall_s"] = time.perf_counter() - began
    print(f"{rows:,} rows in {out['fragments']} fragments written in {out['build_wall_s']:.1f} s", flush=True)

    out["plan_first_fill"] = child("plan", uri, options, "fill")
    column = _column(uri, options, "fill")
    plan = column.plan(WORKERS)
    began_cpu, began = cpu_seconds(), time.perf_counter()
    computed = sum(column.compute_shard(shard, plan.read_version).rows_computed for shard in plan.shards)
    out["shards"] = {"wall_s": time.perf_counter() - began, "cpu_s": cpu_seconds() - began_cpu,
                     "rows_computed": computed, "count": len(plan.shards)}
    assert computed == rows, (computed, rows)
    out["commit_64_shards"] = child("commit", uri, options, "fill")
    assert out["commit_64_shards"]["rows_total"] == rows

    build(uri, options, rows // 1000, fragment_rows, start=rows, mode="append")
    out["plan_after_append"] = child("plan", uri, options, "append")
    assert out["plan_after_append"]["rows_planned"] == rows // 1000
    _column(uri, options, "append").refresh()

    lance.dataset(uri, storage_options=options).update({"x": "x + 1"}, where="id % 100 = 0")
    out["plan_after_change"] = child("plan", uri, options, "change")
    print(json.dumps(out), flush=True)
    return out


CASES = [("plan, first fill", "plan_first_fill"), ("commit of 64 shards", "commit_64_shards"),
         ("plan after 0.1 % appended", "plan_after_append"), ("plan after 1 % changed", "plan_after_change")]


def table(small: dict, large: dict) -> str:
    names = [name.replace("64", str(large["shards"]["count"])) for name, _ in CASES]  # fewer when the table is small
    lines = [f"| case | {small['rows']:,} rows ({small['fragments']} fragments): wall s | CPU s | peak MB "
             f"| {large['rows']:,} rows ({large['fragments']} fragments): wall s | CPU s | peak MB "
             "| 10x: wall | 10x: CPU | 10x: peak |", "| --- |" + " --- |" * 9]
    for name, (_, key) in zip(names, CASES):
        s, b = small[key], large[key]
        lines.append(f"| {name} | {s['wall_s']:.3f} | {s['cpu_s']:.3f} | {s['peak_mb']:.1f} | {b['wall_s']:.3f} | "
                     f"{b['cpu_s']:.3f} | {b['peak_mb']:.1f} | {b['wall_s'] / s['wall_s']:.2f} | "
                     f"{b['cpu_s'] / s['cpu_s']:.2f} | {b['peak_mb'] / max(s['peak_mb'], 0.1):.2f} |")
    for size in (small, large):
        full = size["plan_first_fill"]
        for key in ("plan_after_append", "plan_after_change"):
            lines.append(f"\n{size['rows']:,} rows, {key} / first-fill plan: wall "
                         f"{size[key]['wall_s'] / full['wall_s']:.3f}, CPU {size[key]['cpu_s'] / full['cpu_s']:.3f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=100_000_000)
    parser.add_argument("--small-rows", type=int, default=10_000_000)
    parser.add_argument("--fragment-rows", type=int, default=100_000)
    parser.add_argument("--child")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(step(*json.loads(args.child))))
        return
    from gpufn_devcluster.cluster import binaries_dir
    from gpufn_devcluster.objectstore import ObjectStore

    with ObjectStore(binaries_dir()) as store:
        sizes = [one_size(store, rows, args.fragment_rows) for rows in (args.small_rows, args.rows)]
    print(table(*sizes))
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "scale.json").write_text(json.dumps(sizes, indent=2))


if __name__ == "__main__":
    main()
