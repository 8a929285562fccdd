"""Loading a code location with many Functions: 5 and 50 Functions, on one table or on one table
each, where the location is defined (a code server, `dagster dev`) and where it is reconstructed
(each run worker and step process), beside the release before (`--baseline`, d73661a: its
package from git, imported in place of this one), whose check opened each Function's table in
every process that loaded the location; and the code server given the schemas state file that
`gpufn refresh-state` writes (`state`), which opens no table.

Each figure is one fresh process timing `build_definitions` alone (imports excluded, they do not
grow with Functions): wall seconds, process CPU seconds, tables opened; medians of `--repeat`.
`--storage s3` adds the same on the suite's object store (SeaweedFS, the S3 API), where an open is
round trips rather than a local read.

    .venv/bin/python bench/load_bench.py --repeat 3 --storage local,s3 --baseline d73661a

Prints a Markdown table (paste into BENCHMARKS.md) and writes bench/results/load.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODES = ("define", "state", "reconstruct", "baseline")

CHILD = r'''
import json, os, sys, time
if os.environ.get("BENCH_BASELINE"):  # that release's package, ahead of this checkout's (an editable install's finder too)
    sys.meta_path[:] = [f for f in sys.meta_path if not getattr(f, "__module__", "").startswith("__editable___gpufn_dagster")]
    sys.path.insert(0, os.environ["BENCH_BASELINE"])
import lancedb, lancedb.db
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType
from dagster._core.definitions.repository_definition import RepositoryLoadData
from gpufn_dagster import build_definitions, gpu_function

uri, functions, tables, mode, kept_path = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
options = json.loads(os.environ.get("BENCH_STORAGE_OPTIONS") or "null")

def upper(text: str) -> str:
    return text.upper()

opened = []
real_open = lancedb.db.LanceDBConnection.open_table
def counting(self, name, *args, **kwargs):
    opened.append(name)
    return real_open(self, name, *args, **kwargs)
lancedb.db.LanceDBConnection.open_table = counting

assets = [gpu_function(table=f"t{i % tables}", column=f"c{i}")(upper) for i in range(functions)]
state = {"schemas_state": kept_path + ".state.json"} if mode in ("state", "refresh") else {}
if mode == "refresh":  # what `gpufn refresh-state` does, ahead of the timed load from its file
    from gpufn_dagster.assets.table_schemas import refreshing
    with refreshing():
        build_definitions(assets=assets, db_uri=uri, storage_options=options, **state)
    print("{}")
    sys.exit(0)
if mode == "reconstruct":
    context = DefinitionsLoadContext(DefinitionsLoadType.RECONSTRUCTION, RepositoryLoadData(
        cacheable_asset_data={}, reconstruction_metadata=json.loads(open(kept_path).read())))
else:
    context = DefinitionsLoadContext(DefinitionsLoadType.INITIALIZATION)
with DefinitionsLoadContext.scoped(context):
    cpu, wall = time.process_time(), time.perf_counter()
    build_definitions(assets=assets, db_uri=uri, storage_options=options, **state)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
if mode == "define":
    open(kept_path, "w").write(json.dumps(dict(context.get_pending_reconstruction_metadata())))
import gpufn_dagster
assert ("BENCH_BASELINE" in os.environ) == gpufn_dagster.__file__.startswith(os.environ.get("BENCH_BASELINE", "-")), gpufn_dagster.__file__
print(json.dumps({"wall_seconds": wall, "cpu_seconds": cpu, "tables_opened": len(opened)}))
'''


def child(uri: str, functions: int, tables: int, mode: str, kept: Path, options: dict | None,
          baseline: Path | None = None) -> dict:
    """One load in a fresh process; `baseline`: a directory whose gpufn_dagster is imported instead."""
    env = {**os.environ, "BENCH_STORAGE_OPTIONS": json.dumps(options)}
    if baseline is not None:
        env["BENCH_BASELINE"] = str(baseline)
    done = subprocess.run([sys.executable, "-c", CHILD, uri, str(functions), str(tables), mode, str(kept)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def make_tables(uri: str, count: int, options: dict | None) -> None:
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(uri, storage_options=options)
    for i in range(count):
        db.create_table(f"t{i}", pa.table({"id": list(range(100)), "text": [f"d{j}" for j in range(100)]}), mode="overwrite")


def baseline_package(ref: str) -> Path:
    """The release `ref`'s gpufn_dagster package, from this checkout's git history."""
    target = Path(tempfile.mkdtemp(prefix="gpufn-load-baseline-"))
    archive = subprocess.run(["git", "-C", str(HERE.parent), "archive", ref, "gpufn_dagster"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def measure(storage: str, uri: str, options: dict | None, repeat: int, sizes: list[int], baseline: Path) -> list[dict]:
    rows = []
    make_tables(uri, max(sizes), options)
    kept = Path(tempfile.mkdtemp(prefix="gpufn-load-")) / "kept.json"
    for layout in ("one table", "a table each"):
        for functions in sizes:
            tables = 1 if layout == "one table" else functions
            for mode in MODES:
                runs = []
                for _ in range(repeat):
                    if mode == "reconstruct":  # what the code server kept for this very location
                        child(uri, functions, tables, "define", kept, options)
                    if mode == "state":  # the state file `gpufn refresh-state` writes for it
                        child(uri, functions, tables, "refresh", kept, options)
                    runs.append(child(uri, functions, tables, "define" if mode == "baseline" else mode, kept, options,
                                      baseline if mode == "baseline" else None))
                rows.append({"storage": storage, "layout": layout, "functions": functions, "tables": tables, "mode": mode,
                             "wall_seconds": statistics.median(r["wall_seconds"] for r in runs),
                             "cpu_seconds": statistics.median(r["cpu_seconds"] for r in runs),
                             "tables_opened": runs[0]["tables_opened"]})
                print(rows[-1], flush=True)
    shutil.rmtree(kept.parent, ignore_errors=True)
    return rows


def table(rows: list[dict], sizes: list[int], baseline: str) -> str:
    small, big = min(sizes), max(sizes)
    lines = [f"| storage | layout | load | {small} Functions: wall s / CPU s / opens | {big} Functions: wall s / CPU s / opens "
             f"| {big}/{small} wall | {big}/{small} CPU |", "|---|---|---|---|---|---|---|"]
    keyed = {(r["storage"], r["layout"], r["mode"], r["functions"]): r for r in rows}
    names = {"define": "define (code server)", "state": "define from a schemas state file (code server)",
             "reconstruct": "reconstruct (run worker, step)",
             "baseline": f"{baseline} (every process)"}
    for storage, layout, mode in dict.fromkeys((r["storage"], r["layout"], r["mode"]) for r in rows):
        a, b = keyed[(storage, layout, mode, small)], keyed[(storage, layout, mode, big)]
        lines.append(f"| {storage} | {layout} | {names[mode]} | {a['wall_seconds']:.3f} / {a['cpu_seconds']:.3f} / {a['tables_opened']} "
                     f"| {b['wall_seconds']:.3f} / {b['cpu_seconds']:.3f} / {b['tables_opened']} "
                     f"| {b['wall_seconds'] / max(a['wall_seconds'], 1e-6):.2f} | {b['cpu_seconds'] / max(a['cpu_seconds'], 1e-6):.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--functions", default="5,50", help="the two sizes of the code location, in Functions")
    parser.add_argument("--storage", default="local", help="local, s3 or both (local,s3)")
    parser.add_argument("--baseline", default="d73661a", help="the release to compare with (a git ref of this checkout)")
    parser.add_argument("--out", default=str(HERE / "results" / "load.json"))
    args = parser.parse_args()
    sizes = [int(n) for n in args.functions.split(",")]
    rows = []
    baseline = baseline_package(args.baseline)
    for storage in args.storage.split(","):
        if storage == "local":
            base = Path(tempfile.mkdtemp(prefix="gpufn-load-db-"))
            rows += measure("local", str(base / "db"), None, args.repeat, sizes, baseline)
            shutil.rmtree(base, ignore_errors=True)
        elif storage == "s3":
            sys.path.insert(0, str(HERE.parent / "devcluster"))
            from gpufn_devcluster.cluster import binaries_dir
            from gpufn_devcluster.objectstore import ObjectStore

            with ObjectStore(binaries_dir()) as store:
                rows += measure("s3 (SeaweedFS)", store.uri("bench") + "/db", store.storage_options, args.repeat, sizes,
                                baseline)
        else:
            raise SystemExit(f"--storage: {storage!r} is neither local nor s3")
    shutil.rmtree(baseline, ignore_errors=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(table(rows, sizes, args.baseline))


if __name__ == "__main__":
    main()
