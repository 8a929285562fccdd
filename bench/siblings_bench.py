"""Many Functions on one table: one Function's refresh, and a reader's scans, on a table that holds
1 and 50 other Functions' columns (each with its input signature column and its own data file per
fragment), side by side in one run as ratios 50 / 1; the readers beside a plain Lance table of the
same values without gpufn's bookkeeping; then the same table after gpufn compacted its Function files.

Each table: `--rows` rows (`id`, `x` int64) in 10 fragments, stable row ids, and `--siblings`
Functions `s<k> = x + k` filled by gpufn. Each measurement runs in a fresh process and reports wall
and process CPU seconds (every thread), medians of `--repeat` interleaved rounds:

- scans, as readers do: the two input columns (`id`, `x`); the values (`id`, `x` and every `s<k>`),
  on the gpufn table and on the plain one; every column (`to_table()`: the values and the
  signatures);
- first fill: one more Function `y<r> = x * 2` over every row (a fresh column each round), and
  that Function's refresh after a 0.1 % append (its 0.1 % only);
- files per fragment, then gpufn's compaction of the Function files (`refresh.compaction`, what a
  refresh does once a fragment holds more than `max_function_files`; here forced at 1) and the
  values' scan after it. The tables are built and refreshed with compaction off, as they pile up.

    .venv/bin/python bench/siblings_bench.py --rows 1000000 --siblings 1,50 --repeat 3

Prints Markdown tables (paste into BENCHMARKS.md) and writes bench/results/siblings.json.
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
FRAGMENTS = 10

CHILD = r'''
import json, resource, sys, time
import lance, numpy as np, pyarrow as pa, pyarrow.compute as pc

def cpu():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime

uri, what, arg = sys.argv[1], sys.argv[2], sys.argv[3]
if what in ("fill", "incremental"):
    from gpufn_dagster import make_function, refresh_column
    def double(x: pa.Array) -> pa.Array:
        return pc.multiply(x, 2)
    function = make_function(double, table="t", column=arg, output_type=pa.int64(), batch_size=262144)
    if what == "incremental":  # 0.1 % new rows, not timed
        ds = lance.dataset(uri)
        n, start = max(1, ds.count_rows() // 1000), ds.count_rows()
        lance.write_dataset(pa.table({"id": pa.array(np.arange(start, start + n)), "x": pa.array(np.arange(n))}), uri,
                            mode="append")
    c, w = cpu(), time.perf_counter()
    result = refresh_column(uri, function, max_function_files=None)
    out = {"rows": result.rows_computed}
elif what == "compact":
    from gpufn_dagster.refresh.compaction import compact_function_files
    from gpufn_dagster.refresh.files import TableFiles
    c, w = cpu(), time.perf_counter()
    done = compact_function_files(TableFiles(uri), max_files=int(arg))
    out = {"rows": lance.dataset(uri).count_rows(), "fragments": done.fragments, "files_before": done.files_before}
elif what == "scan":
    c, w = cpu(), time.perf_counter()
    table = lance.dataset(uri).to_table(columns=None if arg == "all" else arg.split(","))
    out = {"rows": table.num_rows, "columns": table.num_columns, "bytes": table.nbytes}
print(json.dumps({**out, "wall_seconds": time.perf_counter() - w, "cpu_seconds": cpu() - c}))
'''


def child(uri: str, what: str, arg: str) -> dict:
    done = subprocess.run([sys.executable, "-c", CHILD, uri, what, arg], capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def build(uri: str, rows: int, siblings: int) -> None:
    """The table with `siblings` gpufn Functions filled."""
    import lance
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpufn_dagster import make_function, refresh_column

    lance.write_dataset(pa.table({"id": pa.array(np.arange(rows)), "x": pa.array(np.arange(rows) % 1_000_003)}), uri,
                        max_rows_per_file=rows // FRAGMENTS, enable_stable_row_ids=True)
    def adding(k: int):
        def plus(x: pa.Array) -> pa.Array:
            return pc.add(x, k)
        return plus

    for k in range(siblings):
        plus = adding(k)
        refresh_column(uri, make_function(plus, table="t", column=f"s{k}", output_type=pa.int64(), batch_size=262144),
                       max_function_files=None)  # piled up as they were before gpufn compacted them


def plain(uri: str, source: str) -> None:
    """The same values as a plain Lance table: no signature columns, one data file per fragment."""
    import lance

    ds = lance.dataset(source)
    columns = [n for n in ds.schema.names if not n.startswith("_gpufn")]
    lance.write_dataset(ds.to_table(columns=columns), uri, max_rows_per_file=ds.count_rows() // FRAGMENTS)


def files_per_fragment(uri: str) -> float:
    import lance

    fragments = lance.dataset(uri).get_fragments()
    return statistics.mean(len(f.data_files()) for f in fragments)


def median(runs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--siblings", default="1,50", help="the two numbers of other Functions on the table")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--out", default=str(HERE / "results" / "siblings.json"))
    args = parser.parse_args()
    counts = [int(n) for n in args.siblings.split(",")]
    base = Path(tempfile.mkdtemp(prefix="gpufn-siblings-"))
    uris = {s: str(base / f"s{s}" / "t.lance") for s in counts}
    plains = {s: str(base / f"plain{s}" / "t.lance") for s in counts}
    files = {}
    for s in counts:
        build(uris[s], args.rows, s)
        plain(plains[s], uris[s])
        files[s] = files_per_fragment(uris[s])
        print(f"built: {s} siblings, {files[s]:.0f} files per fragment", flush=True)
    runs: dict[tuple, list[dict]] = {}
    values = {n: ",".join(["id", "x", *(f"s{k}" for k in range(n))]) for n in counts}
    for r in range(args.repeat):  # readers first, on the tables as built; interleaved rounds
        for n in counts:
            runs.setdefault(("scan id, x", n), []).append(child(uris[n], "scan", "id,x"))
            runs.setdefault(("scan id, x (plain table)", n), []).append(child(plains[n], "scan", "id,x"))
            runs.setdefault(("scan the values (id, x, every s)", n), []).append(child(uris[n], "scan", values[n]))
            runs.setdefault(("scan the values (plain table)", n), []).append(child(plains[n], "scan", values[n]))
            runs.setdefault(("scan every column (values + signatures)", n), []).append(child(uris[n], "scan", "all"))
    for r in range(args.repeat):  # then one more Function's refresh
        for n in counts:
            runs.setdefault(("first fill of one more Function", n), []).append(child(uris[n], "fill", f"y{r}"))
            runs.setdefault(("its refresh after a 0.1 % append", n), []).append(child(uris[n], "incremental", f"y{r}"))
            print(f"round {r + 1}, {n} siblings", flush=True)
    for n in counts:  # gpufn's compaction of the Function files (what a refresh does past its bound)
        runs[("gpufn's compaction (every Function file of a fragment made one)", n)] = [child(uris[n], "compact", "1")]
        runs[("scan the values, after the compaction", n)] = [child(uris[n], "scan", values[n]) for _ in range(args.repeat)]
    compacted = {n: files_per_fragment(uris[n]) for n in counts}
    small, big = min(counts), max(counts)
    rows = [{"case": case, "siblings": s, "wall_seconds": median(v, "wall_seconds"), "cpu_seconds": median(v, "cpu_seconds"),
             "rows": v[0]["rows"]} for (case, s), v in runs.items()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"rows": rows, "files_per_fragment": files, "after_compaction": compacted}, indent=1))
    keyed = {(r["case"], r["siblings"]): r for r in rows}
    print(f"\n{args.rows:,} rows, {FRAGMENTS} fragments; medians of {args.repeat}\n")
    print(f"| case | {small} siblings: wall s / CPU s | {big} siblings: wall s / CPU s | {big}/{small} wall | {big}/{small} CPU |")
    print("|---|---|---|---|---|")
    for case in dict.fromkeys(r["case"] for r in rows):
        a, b = keyed[(case, small)], keyed[(case, big)]
        print(f"| {case} | {a['wall_seconds']:.3f} / {a['cpu_seconds']:.3f} | {b['wall_seconds']:.3f} / {b['cpu_seconds']:.3f} "
              f"| {b['wall_seconds'] / a['wall_seconds']:.2f} | {b['cpu_seconds'] / a['cpu_seconds']:.2f} |")
    print("\n| siblings | files per fragment (as built) | scan the values: gpufn / plain (CPU) | every column / plain values (CPU) "
          "| after the compaction: files per fragment | values / plain (CPU) |")
    print("|---|---|---|---|---|---|")
    for n in counts:
        plain_values = keyed[("scan the values (plain table)", n)]["cpu_seconds"]
        print(f"| {n} | {files[n]:.1f} | {keyed[('scan the values (id, x, every s)', n)]['cpu_seconds'] / plain_values:.2f} "
              f"| {keyed[('scan every column (values + signatures)', n)]['cpu_seconds'] / plain_values:.2f} "
              f"| {compacted[n]:.1f} | {keyed[('scan the values, after the compaction', n)]['cpu_seconds'] / plain_values:.2f} |")
    shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
