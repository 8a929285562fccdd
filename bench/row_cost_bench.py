"""Where a refreshed row's CPU goes: one refresh of a trivial batch UDF (`x * 2`) on a fresh table,
its process CPU seconds split by part, per row.

Parts are measured where they run: the engine's Python parts with each thread's own CPU clock
(`RUSAGE_THREAD`) around the function that does them (reading, signatures, staging, the Function's
call, outputs, writing), Lance's own threads (decoding reads, encoding and flushing writes) from
their /proc counters, the refresh's own thread (plan, lease, commit, waiting for the
fragments) with its clock, and the rest (the fragment and model threads outside the timed parts,
the lease's renewer) as the remainder of the process's CPU. A profiler that samples stacks misses short-lived worker threads; this does not.

    .venv/bin/python bench/row_cost_bench.py --rows 5000000 --repeat 5

Prints a Markdown table (paste into BENCHMARKS.md) and writes bench/results/row_cost.json.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
PARTS = ("read (engine thread)", "signatures", "staging (rest)", "Function call (x * 2)", "outputs", "write (engine thread)",
         "Lance threads (decode, encode, I/O)", "refresh's own thread (plan, lease, commit)", "rest (other threads)")


def _thread_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime + usage.ru_stime


def _lance_threads_cpu() -> float:
    """CPU seconds of the process's threads that Lance started (tokio runtimes), by their names;
    from each thread's schedstat (nanoseconds on a CPU), not the stat file's 10 ms ticks."""
    total = 0
    for tid in os.listdir("/proc/self/task"):
        try:
            name = Path(f"/proc/self/task/{tid}/comm").read_text().strip()
            on_cpu = int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0])
        except FileNotFoundError:
            continue
        if name.startswith(("lance", "tokio")):
            total += on_cpu
    return total / 1e9


def run_child(uri: str) -> dict:
    """One refresh with its parts timed (in a fresh process)."""
    import pyarrow as pa

    import gpufn_dagster.refresh.execute as execute
    import gpufn_dagster.refresh.fragments as fragments
    import gpufn_dagster.refresh.write as write
    from gpufn_dagster import make_function, refresh_column
    from refresh_bench import BATCH_ROWS, cpu_seconds, double_x

    spent: Counter[str] = Counter()
    lock = threading.Lock()

    def timed(owner, name: str, part: str) -> None:
        original = getattr(owner, name)

        @functools.wraps(original)
        def wrapper(*args, **kwargs):
            began = _thread_cpu()
            try:
                return original(*args, **kwargs)
            finally:
                with lock:
                    spent[part] += _thread_cpu() - began
        setattr(owner, name, wrapper)

    timed(fragments, "row_signatures", "signatures")
    timed(fragments, "_stage", "_stage")
    timed(fragments, "_outputs", "outputs")
    timed(write.FragmentFileWriter, "write", "write (engine thread)")
    timed(execute, "_call_batch", "Function call (x * 2)")
    cut_calls = fragments.cut_calls

    def reads(*args, **kwargs):
        calls = cut_calls(*args, **kwargs)
        while True:
            began = _thread_cpu()
            try:
                call = next(calls)
            except StopIteration:
                return
            finally:
                with lock:
                    spent["read (engine thread)"] += _thread_cpu() - began
            yield call
    fragments.cut_calls = reads

    import lancedb

    table = lancedb.connect(uri).open_table("t")
    function = make_function(double_x, table="t", column="y", output_type=pa.int64(), batch_size=BATCH_ROWS)
    lance_before, began, own = _lance_threads_cpu(), cpu_seconds(), _thread_cpu()
    result = refresh_column(table.to_lance().uri, function)
    total, lance, own = cpu_seconds() - began, _lance_threads_cpu() - lance_before, _thread_cpu() - own
    # `_stage` holds the signatures and, with prefetch 0, nothing else: the call runs on the model thread.
    parts = {"read (engine thread)": spent["read (engine thread)"], "signatures": spent["signatures"],
             "staging (rest)": spent["_stage"] - spent["signatures"],
             "Function call (x * 2)": spent["Function call (x * 2)"], "outputs": spent["outputs"],
             "write (engine thread)": spent["write (engine thread)"], "Lance threads (decode, encode, I/O)": lance,
             "refresh's own thread (plan, lease, commit)": own}
    parts["rest (other threads)"] = total - sum(parts.values())
    return {"rows": result.rows_computed, "cpu_seconds": total, "parts": parts}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child")
    args = parser.parse_args()
    sys.path.insert(0, str(HERE))
    if args.child:
        print(json.dumps(run_child(args.child)))
        return
    from refresh_bench import make_table

    work = Path(tempfile.mkdtemp(prefix="gpufn-rowcost-"))
    runs = []
    try:
        make_table(str(work / "base"), args.rows)
        for _ in range(args.repeat):
            shutil.rmtree(work / "db", ignore_errors=True)
            shutil.copytree(work / "base", work / "db")
            done = subprocess.run([sys.executable, __file__, "--child", str(work / "db")], capture_output=True,
                                  text=True, check=True)
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(runs[-1]), file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = runs[0]["rows"]
    medians = {part: statistics.median(r["parts"][part] for r in runs) for part in PARTS}
    total = statistics.median(r["cpu_seconds"] for r in runs)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / "row_cost.json").write_text(json.dumps({"medians": medians, "runs": runs}, indent=2))
    print(f"{rows:,} rows, {len(runs)} runs, medians\n\n| part | CPU s | CPU ns/row | share |\n| --- | --- | --- | --- |")
    for part in PARTS:
        print(f"| {part} | {medians[part]:.3f} | {medians[part] / rows * 1e9:.0f} | {medians[part] / total:.0%} |")
    print(f"| **process (median of totals)** | {total:.3f} | {total / rows * 1e9:.0f} | |")


if __name__ == "__main__":
    main()
