"""The engine's share (issue 41, item 6): replays the GPU's measured MiniLM calls through `refresh_column`
on this machine, to tell how much of the GPU the engine keeps fed.

Reads the JSON of `bench/gpu_model_bench.py` (run on the GPU machine). For one sequence length (128
tokens by default), one dtype and each call size B it measured, the GPU's rate is B / (mean seconds of
one call). A LanceDB table of --rows short documents (`gpufn_dagster.sample.sample_docs`, the
example's `docs`; `--text-words 100` for rows about as long as 128 tokens) is refreshed through the
engine with a batch UDF that, instead of the model, sleeps rows / rate seconds per call and returns
one precomputed 384-float vector per row (`batch_size=B`, `adapt_batch_size=False`, calls pinned at
B). Its rows/s against the GPU's own is the engine's share: 1.0 = the GPU never waits for the
engine. The UDF's sleep holds no CPU, so the process's CPU seconds (time.process_time, getrusage)
are the engine's own: reading, hashing, writing, committing, Lance's threads included.

Modes replayed: `encode` (the model's call with tokenization, what the example's Embedder does on the
model thread) and `forward` (the GPU alone, as if tokenization ran elsewhere).

Each case runs in a fresh process (its own peak RSS), one column per case on the same table.

    .venv/bin/python bench/engine_replay_bench.py --gpu-json <files_at>/gpu_model.json --rows 200000

Prints a Markdown table and writes bench/results/engine_replay.json (--out).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DIM = 384
sys.path.insert(0, str(ROOT))  # this checkout's package


def gpu_rates(data: dict, seq: int, dtype: str | None, modes: list[str]) -> tuple[str, list[dict]]:
    """The measured calls to replay: [{mode, batch, call_s_mean, rows_per_s}] for `seq` and `dtype`."""
    ok = [r for r in data["results"] if r.get("status") == "ok" and r["seq"] == seq and r["mode"] in modes]
    if not ok:
        raise SystemExit(f"no usable result at seq {seq} for modes {modes} in the GPU JSON")
    if dtype in (None, "auto"):
        present = {r["dtype"] for r in ok}
        dtype = next((d for d in ("fp16", "bf16", "fp32") if d in present), sorted(present)[0])
    rates = [{"mode": r["mode"], "batch": r["batch"], "call_s_mean": r["call_s_mean"],
              "rows_per_s": r["batch"] / r["call_s_mean"], "sentences_per_s_window": r["sentences_per_s"]}
             for r in ok if r["dtype"] == dtype]
    rates.sort(key=lambda r: (modes.index(r["mode"]), r["batch"]))
    return dtype, rates


def make_table(uri: str, rows: int, fragment_rows: int, text_words: int) -> dict:
    import lancedb
    import pyarrow as pa

    from gpufn_dagster.sample import sample_docs

    def chunk(start: int, n: int) -> pa.Table:
        t = sample_docs(n, start_id=start)
        if text_words:
            import random

            rng = random.Random(start)
            words = " ".join(t.column("text").to_pylist()).replace(".", "").lower().split()
            vocab = sorted(set(words))
            long = [" ".join(rng.choices(vocab, k=text_words)) + "." for _ in range(n)]
            t = t.set_column(t.schema.get_field_index("text"), "text", pa.array(long, pa.string()))
        return t

    db = lancedb.connect(uri)
    first = min(rows, fragment_rows)
    table = db.create_table("docs", chunk(0, first), storage_options={"new_table_enable_stable_row_ids": "true"})
    start = first
    while start < rows:
        n = min(fragment_rows, rows - start)
        table.add(chunk(start, n))
        start += n
    texts = table.to_lance().to_table(columns=["text"]).column("text")
    import pyarrow.compute as pc

    return {"rows": table.count_rows(), "fragments": len(table.to_lance().get_fragments()),
            "text_bytes_mean": pc.mean(pc.binary_length(texts)).as_py()}


def run_case(uri: str, batch: int, rate: float, column: str, concurrency: int | None) -> dict:
    """In a child process: one refresh of a fresh column through the engine, the UDF sleeping rows / rate."""
    import resource

    import lance
    import numpy as np
    import pyarrow as pa

    from gpufn_dagster import make_function, refresh_column

    flat = pa.array(np.random.default_rng(0).standard_normal(batch * DIM).astype(np.float32))
    slept = {"seconds": 0.0, "calls": 0, "rows": 0}

    def embed(text: pa.Array) -> pa.Array:
        n = len(text)
        t = time.perf_counter()
        time.sleep(n / rate)
        slept["seconds"] += time.perf_counter() - t
        slept["calls"] += 1
        slept["rows"] += n
        return pa.FixedSizeListArray.from_arrays(flat.slice(0, n * DIM), DIM)

    function = make_function(embed, table="docs", column=column, output_type=pa.list_(pa.float32(), DIM),
                             batch_size=batch, adapt_batch_size=False, gpu=True)
    table_uri = lance.dataset(uri).uri
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    cpu0 = time.process_time()
    began = time.perf_counter()
    options = {} if concurrency is None else {"concurrency": concurrency}
    result = refresh_column(table_uri, function, **options)
    wall = time.perf_counter() - began
    cpu = time.process_time() - cpu0
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    rows = result.rows_computed
    ideal = rows / rate  # the GPU's own time for these rows
    return {
        "rows": rows, "calls": slept["calls"], "fragments": result.fragments_total,
        "wall_s": wall, "result_wall_s": result.wall_seconds, "compute_s": result.compute_seconds,
        "load_s": result.load_seconds, "busy_s": result.busy_seconds, "busy_fraction": result.busy_fraction,
        "udf_sleep_s": slept["seconds"], "gpu_ideal_s": ideal,
        "engine_rows_per_s": rows / result.compute_seconds if result.compute_seconds else None,
        "engine_rows_per_s_wall": rows / wall,
        "share": ideal / result.compute_seconds if result.compute_seconds else None,
        "share_wall": ideal / wall,
        "cpu_s": cpu, "cpu_us_per_row": 1e6 * cpu / rows if rows else None,
        "rusage_user_s": ru1.ru_utime - ru0.ru_utime, "rusage_sys_s": ru1.ru_stime - ru0.ru_stime,
        "cpu_cores_busy": cpu / wall,
        "peak_rss_mib": ru1.ru_maxrss / 1024,
        "concurrency": concurrency or min(4, os.cpu_count() or 1),
    }


def child(args: list[str]) -> dict:
    done = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, cwd=ROOT)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip()[-2000:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gpu-json", required=False, help="the JSON bench/gpu_model_bench.py wrote")
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--fragment-rows", type=int, default=50_000, help="rows per fragment (one `add` each)")
    p.add_argument("--text-words", type=int, default=0, help="0: the example's short documents; N: N words a row")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--dtype", default="auto", help="fp16, bf16, fp32 or auto (fp16 when present)")
    p.add_argument("--modes", default="encode,forward")
    p.add_argument("--batches", help="only these call sizes (comma-separated)")
    p.add_argument("--concurrency", type=int, help="fragments at once (engine default: min(4, CPUs))")
    p.add_argument("--speedup", type=float, default=1.0, help="multiply the GPU's rates (to test quickly on CPU "
                                                              "figures; 1 for the real replay)")
    p.add_argument("--out", default=str(HERE / "results" / "engine_replay.json"))
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        uri, batch, rate, column, conc = args.child
        print(json.dumps(run_case(uri, int(batch), float(rate), column, None if conc == "-" else int(conc))))
        return
    if not args.gpu_json:
        p.error("--gpu-json is required")
    data = json.loads(Path(args.gpu_json).read_text())
    modes = args.modes.split(",")
    dtype, rates = gpu_rates(data, args.seq, args.dtype, modes)
    if args.batches:
        keep = {int(b) for b in args.batches.split(",")}
        rates = [r for r in rates if r["batch"] in keep]
    env = data.get("env", {})
    work = Path(tempfile.mkdtemp(prefix="gpufn-replay-"))
    results = []
    try:
        uri = str(work / "db")
        t = time.perf_counter()
        table = make_table(uri, args.rows, args.fragment_rows, args.text_words)
        print(f"table: {table['rows']:,} rows in {table['fragments']} fragments, text {table['text_bytes_mean']:.0f} B "
              f"a row, built in {time.perf_counter() - t:.1f}s; GPU figures: {env.get('gpu_name') or env.get('platform')}, "
              f"seq {args.seq}, {dtype}; this machine: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}",
              file=sys.stderr, flush=True)
        dataset_uri = str(work / "db" / "docs.lance")
        for r in rates:
            rate = r["rows_per_s"] * args.speedup
            column = f"v_{r['mode']}_{r['batch']}"
            load = os.getloadavg()[0]
            res = child([dataset_uri, str(r["batch"]), repr(rate), column,
                         "-" if args.concurrency is None else str(args.concurrency)])
            results.append({"mode": r["mode"], "batch": r["batch"], "gpu_call_s": r["call_s_mean"] / args.speedup,
                            "gpu_rows_per_s": rate, "loadavg_before": load, **res})
            if "error" in res:
                print(f"{r['mode']} batch {r['batch']}: failed: {res['error'][-500:]}", file=sys.stderr, flush=True)
            else:
                print(f"{r['mode']:>8} batch {r['batch']:>5}: GPU {rate:>10,.0f} rows/s, engine "
                      f"{res['engine_rows_per_s']:>10,.0f} rows/s, share {res['share']:.3f}, busy "
                      f"{res['busy_fraction']:.3f}, wall {res['wall_s']:.1f}s, CPU {res['cpu_s']:.1f}s "
                      f"({res['cpu_us_per_row']:.1f} us/row)", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"gpu_json": str(args.gpu_json), "gpu_env": env, "seq": args.seq, "dtype": dtype,
                               "rows": args.rows, "fragment_rows": args.fragment_rows, "table": table,
                               "text_words": args.text_words, "speedup": args.speedup, "cpus": os.cpu_count(),
                               "results": results}, indent=1))
    print(f"\nGPU figures: {env.get('gpu_name') or 'cpu'} ({args.gpu_json}), seq {args.seq}, {dtype}; "
          f"engine on this machine ({os.cpu_count()} CPUs), {table['rows']:,} rows in {table['fragments']} fragments"
          + (f", GPU rates x{args.speedup:g}" if args.speedup != 1 else ""))
    print("\n| mode | rows/call | GPU rows/s | engine rows/s | share | busy fraction | wall s | CPU s | "
          "CPU us/row | peak RSS MiB |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in results:
        if "error" in r:
            print(f"| {r['mode']} | {r['batch']} | {r['gpu_rows_per_s']:,.0f} | failed | | | | | | |")
            continue
        print(f"| {r['mode']} | {r['batch']} | {r['gpu_rows_per_s']:,.0f} | {r['engine_rows_per_s']:,.0f} | "
              f"{r['share']:.3f} | {r['busy_fraction']:.3f} | {r['wall_s']:.2f} | {r['cpu_s']:.2f} | "
              f"{r['cpu_us_per_row']:.1f} | {r['peak_rss_mib']:.0f} |")


if __name__ == "__main__":
    main()
