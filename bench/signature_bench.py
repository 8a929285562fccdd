"""Per-row input signatures: what it costs to tell which rows changed, per input type.

gpufn hashes each row's input values following Arrow's structure (numpy, vectorized; top-level
strings are digested by Lance while it scans). The alternative a user would write by hand to
detect changed rows is a per-row cryptographic hash of a serialization of the value
(`hashlib.blake2b(json.dumps(value))`, injective as long as the serialization is); both run on the same
table, in one process, each including the scan, and reported as rows/s and a ratio.

    .venv/bin/python bench/signature_bench.py --rows 1000000

Prints a Markdown table (paste into BENCHMARKS.md).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa

from gpufn_dagster.function_spec.functions import make_function
from gpufn_dagster.refresh.signature import row_signatures, scan_expressions


def columns(rows: int) -> dict[str, pa.Array]:
    rng = np.random.default_rng(7)
    words = np.array(["alpha", "beta", "gamma", "delta", "", "Hello, world", "x" * 40])
    text = [" ".join(rng.choice(words, 8)) for _ in range(rows)]
    offsets = np.arange(0, rows * 3 + 1, 3, dtype=np.int32)
    return {
        "int64": pa.array(rng.integers(0, 1 << 40, rows)),
        "text (string)": pa.array(text, pa.string()),
        "tags (list<string>)": pa.ListArray.from_arrays(pa.array(offsets), pa.array(rng.choice(words, rows * 3).tolist(), pa.string())),
        "embedding (fixed_size_list<float32>[384])": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.random(rows * 384, dtype=np.float32)), 384),
    }


def by_hand(array: pa.Array) -> list[bytes]:
    return [hashlib.blake2b(json.dumps(v, default=str).encode(), digest_size=8).digest() for v in array.to_pylist()]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufn-sig-bench-"))
    print("| input | rows | gpufn rows/s | per-row blake2b(json) rows/s | ratio |\n| --- | --- | --- | --- | --- |")
    try:
        for name, array in columns(args.rows).items():
            uri = str(work / f"{len(list(work.iterdir()))}.lance")
            lance.write_dataset(pa.table({"v": array}), uri)
            dataset = lance.dataset(uri)

            def f(v: str) -> str:
                return v

            function = make_function(f, table="t", column="out", output_type=pa.string())
            scan = {"v": "`v`"} | scan_expressions(function, dataset.schema)
            started = time.perf_counter()  # both include the scan: Lance digests top-level strings in it
            for batch in dataset.scanner(columns=scan, batch_size=65536).to_batches():
                row_signatures(function, batch)
            ours = args.rows / (time.perf_counter() - started)
            started = time.perf_counter()
            for batch in dataset.scanner(columns=["v"], batch_size=65536).to_batches():
                by_hand(batch.column("v"))
            theirs = args.rows / (time.perf_counter() - started)
            print(f"| {name} | {args.rows:,} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.0f}x |")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
