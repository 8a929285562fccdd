"""The GPU worker, side by side on the same tables and batches (issue 12):

1. `engine` vs `bare`: the example's MiniLM embedding Function through `refresh_column` (calls
   pinned at --batch rows) vs a bare loop that reads the same column with Lance and calls the same
   model on the same batches -- the physical limit. `engine_adaptive` is the engine with its
   defaults (a 64-row probe, then calls adapting toward 1 s). Model loading is left out of all three
   (each process loads the model once, timed apart).
2. `sleep_prefetch` vs `sleep_sequential`: a UDF that sleeps a fixed time per call (a stand-in for
   a GPU kernel) on wide string rows, so reading, decoding and hashing cost as much as the call:
   the worker's busy fraction (time inside the Function / time computing) with reading ahead, and
   without (`prefetch=0`).
3. `first_row`: time from the start of a refresh of a 1M-row table to its first values, with the
   engine's default probe and with the earlier fixed default of 1,024 rows per call, MiniLM model.

Each case runs in a fresh process; pairs run alternately (A B A B ...) and each ratio is taken per
pair, then the median. Prints the device the model ran on (a GPU when one is present) and a
Markdown table; writes bench/results/worker.json.

    .venv/bin/python bench/worker_bench.py --rows 4000 --repeat 3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WIDE_BYTES = 16_384  # per row of the sleep case: reading and hashing it is real work
SLEEP_ROWS, SLEEP_BATCH, SLEEP_SECONDS = 16_384, 256, 0.05
sys.path.insert(0, str(ROOT))  # the example's Function (docs_pipeline) and this checkout's package


def _vector():
    import pyarrow as pa

    return pa.list_(pa.float32(), 384)


def make_tables(base: Path, rows: int, big_rows: int) -> None:
    import lancedb
    import pyarrow as pa

    from gpufn_dagster.sample import sample_docs

    db = lancedb.connect(str(base))
    db.create_table("docs", sample_docs(rows))
    wide = pa.table({"id": list(range(SLEEP_ROWS)),
                     "blob": [f"{i:08d}" * (WIDE_BYTES // 8) for i in range(SLEEP_ROWS)]})
    db.create_table("wide", wide)
    big = db.create_table("big", sample_docs(min(big_rows, 100_000)))
    block = big.to_arrow()
    for _ in range(big_rows // len(block) - 1):  # 1M rows by default, in blocks of 100,000
        big.add(block)


def _embedder():
    from docs_pipeline.udfs import MiniLMEmbedder

    return MiniLMEmbedder


def _device(model) -> str:
    return str(model.model.device)


def case_engine(base: Path, batch: int, adaptive: bool) -> dict:
    import lance

    from gpufn_dagster import make_function, refresh_column

    embedder = _embedder()
    function = make_function(embedder, table="docs", column=f"v_{time.time_ns()}", output_type=_vector(),
                             **({} if adaptive else {"batch_size": batch}), adapt_batch_size=adaptive, gpu=True)
    result = refresh_column(lance.dataset(str(base / "docs.lance")).uri, function)
    device = "cuda" if _cuda() else "cpu"
    return {"seconds": result.wall_seconds - result.load_seconds, "load_seconds": result.load_seconds,
            "rows": result.rows_computed, "busy_fraction": result.busy_fraction, "device": device,
            "largest_call": result.batch_rows_largest}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def case_bare(base: Path, batch: int) -> dict:
    import lance

    began = time.monotonic()
    model = _embedder()()
    loaded = time.monotonic()
    rows = 0
    for part in lance.dataset(str(base / "docs.lance")).to_batches(columns=["text"], batch_size=batch):
        rows += len(model(part.column("text")))
    return {"seconds": time.monotonic() - loaded, "load_seconds": loaded - began, "rows": rows,
            "device": _device(model)}


def case_sleep(base: Path, prefetch: int | None) -> dict:
    """The sleep UDF on the wide table (one 256 MB fragment), calls pinned at SLEEP_BATCH rows."""
    import lance
    import pyarrow as pa
    import pyarrow.compute as pc

    from gpufn_dagster import make_function, refresh_column

    def kernel(blob: pa.Array) -> pa.Array:
        time.sleep(SLEEP_SECONDS)
        return pc.binary_length(blob).cast(pa.int64())

    function = make_function(kernel, table="wide", column=f"n_{prefetch}_{time.time_ns()}", output_type=pa.int64(),
                             batch_size=SLEEP_BATCH, adapt_batch_size=False)
    uri = lance.dataset(str(base / "wide.lance")).uri
    result = refresh_column(uri, function) if prefetch is None else refresh_column(uri, function, prefetch=prefetch)
    return {"seconds": result.compute_seconds, "rows": result.rows_computed, "busy_fraction": result.busy_fraction,
            "calls": SLEEP_ROWS // SLEEP_BATCH}


class _FirstValues(Exception):
    pass


def case_first_row(base: Path, batch: int, adaptive: bool) -> dict:
    import lance
    import pyarrow as pa

    from gpufn_dagster import make_function, refresh_column

    embedder = _embedder()
    seen: dict[str, float] = {}

    class Probe(embedder):  # stops the refresh once the first values came back
        def __init__(self) -> None:
            super().__init__()
            seen["loaded"] = time.monotonic()

        def __call__(self, text: pa.Array) -> pa.Array:
            if "first" in seen:
                raise _FirstValues
            values = super().__call__(text)
            seen["first"], seen["rows"] = time.monotonic(), len(text)
            return values

    function = make_function(Probe, table="big", column="v", output_type=_vector(),
                             **({} if adaptive else {"batch_size": batch}), adapt_batch_size=adaptive, gpu=True)
    began = time.monotonic()
    try:
        refresh_column(lance.dataset(str(base / "big.lance")).uri, function)
    except Exception:  # the Probe's stop, wrapped as the Function's failure
        if "first" not in seen:
            raise
    return {"seconds": seen["first"] - began, "rows": seen["rows"], "load_seconds": seen["loaded"] - began,
            "after_load_seconds": seen["first"] - seen["loaded"]}


CASES = {
    "engine": lambda base, a: case_engine(base, a.batch, adaptive=False),
    "engine_adaptive": lambda base, a: case_engine(base, a.batch, adaptive=True),
    "bare": lambda base, a: case_bare(base, a.batch),
    "sleep_prefetch": lambda base, a: case_sleep(base, prefetch=None),
    "sleep_sequential": lambda base, a: case_sleep(base, prefetch=0),
    "first_row_probe": lambda base, a: case_first_row(base, 64, adaptive=True),
    "first_row_1024": lambda base, a: case_first_row(base, 1024, adaptive=False),
}


def run_case(base: Path, name: str, args: argparse.Namespace) -> dict:
    out = subprocess.run([sys.executable, __file__, "--one", name, "--base", str(base), "--batch", str(args.batch)],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=4000, help="rows of the MiniLM table")
    parser.add_argument("--batch", type=int, default=256, help="rows per call, engine and bare loop alike")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--big-rows", type=int, default=1_000_000, help="rows of the first-values table")
    parser.add_argument("--one")
    parser.add_argument("--base")
    args = parser.parse_args()
    if args.one:
        print(json.dumps(CASES[args.one](Path(args.base), args)))
        return
    base = Path(tempfile.mkdtemp(prefix="gpufn-worker-bench-"))
    make_tables(base, args.rows, args.big_rows)
    pairs = [("engine", "bare"), ("engine_adaptive", "bare"), ("sleep_prefetch", "sleep_sequential"),
             ("first_row_probe", "first_row_1024")]
    results: dict[str, list[dict]] = {}
    ratios: dict[str, list[float]] = {}
    for a, b in pairs:
        for _ in range(args.repeat):
            for name in (a, b):
                results.setdefault(name, []).append(run_case(base, name, args))
            ratios.setdefault(f"{a} / {b}", []).append(results[a][-1]["seconds"] / results[b][-1]["seconds"])
    device = results["bare"][0]["device"]
    print(f"device: {device}; MiniLM table {args.rows:,} rows, {args.batch} rows per call; sleep case "
          f"{SLEEP_ROWS:,} rows of {WIDE_BYTES:,} B, {SLEEP_BATCH} rows per call, {SLEEP_SECONDS * 1000:.0f} ms per call")
    print("\n| case | seconds (median) | rows | busy fraction | model load s | after the load s |\n"
          "| --- | --- | --- | --- | --- | --- |")
    for name, runs in results.items():
        busy = statistics.median(r["busy_fraction"] for r in runs) if "busy_fraction" in runs[0] else None
        load = statistics.median(r["load_seconds"] for r in runs) if "load_seconds" in runs[0] else None
        after = statistics.median(r["after_load_seconds"] for r in runs) if "after_load_seconds" in runs[0] else None
        print(f"| {name} | {statistics.median(r['seconds'] for r in runs):.2f} | {runs[0]['rows']:,} | "
              f"{'' if busy is None else f'{busy:.3f}'} | {'' if load is None else f'{load:.1f}'} | "
              f"{'' if after is None else f'{after:.2f}'} |")
    print("\n| ratio | median | pairs |\n| --- | --- | --- |")
    for name, values in ratios.items():
        print(f"| {name} | {statistics.median(values):.3f} | {', '.join(f'{v:.3f}' for v in values)} |")
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "worker.json").write_text(json.dumps({"device": device, "results": results, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
