"""Every benchmark in bench/ still runs: each script at tiny sizes, as BENCHMARKS.md's commands
run it, so an argument or an import that no longer exists fails here, not on the next
measurement. Nothing is timed; a script passes when it exits 0 and prints its table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufn_devcluster import processes

from ..conftest import REPO

BENCH = REPO / "bench"
# script -> (tiny arguments, what its output always holds, needs the built control plane)
CASES = {
    "adopt_bench.py": (["--rows", "3000", "--small-rows", "1500", "--repeat", "1"], "| adopt |", False),
    "capacity_bench.py": (["--runs", "3,6", "--nodes", "50"], "| tick writing nothing (the steady tick's", True),
    "deploy_bench.py": (["--shards", "1", "--fragment-rows", "1100"], "| launch -> commit done |", True),
    "dra_bench.py": (["--nodes", "20"], "| steady tick |", False),
    "engine_replay_bench.py": (["--gpu-json", "bench/figures/h200_minilm.json", "--rows", "2000", "--fragment-rows",
                                "1000", "--modes", "encode", "--batches", "256", "--out", "{tmp}/replay.json"],
                               "| mode | rows/call |", False),
    "gpu_model_bench.py": (["--model", "{tmp}/carry/minilm", "--device", "cpu", "--quick", "--seqs", "64",
                            "--batches", "8", "--no-extras", "--out", "{tmp}/gpu_model.json"], "| seq |", False),
    "prepare_minilm_carry.py": (["--out", "{tmp}/carry"], "model.safetensors", False),
    "tokenizer_split_bench.py": (["{tmp}/carry/minilm"], "rows/s", False),
    "fanout_bench.py": (["--rows", "1200", "--workers", "1,2", "--storage-rows", "2000", "--plan-rows", "20000"],
                        "|", True),
    "load_bench.py": (["--repeat", "1", "--functions", "2,3", "--out", "{tmp}/load.json"], "| reconstruct (run worker, step) |",
                      False),
    "partition_bench.py": (["--rows", "2000", "--days", "10"], "partitions / one =", False),
    "placement_bench.py": (["--runs", "3"], "| whole launch_run: GpuK8sRunLauncher", False),
    "queue_bench.py": (["--runs", "3", "--replay-runs", "200"], "runs estimated", True),  # 50 warm up
    "scale_bench.py": (["--rows", "40000", "--small-rows", "4000", "--fragment-rows", "2000"],
                       "| plan after 1 % changed |", True),  # SeaweedFS
    "queue_pass_bench.py": (["--steps", "3,6"], "| pass writing nothing (the steady pass's", False),
    "refresh_bench.py": (["--rows", "2000", "--small-rows", "1000", "--repeat", "1"], "| gpufn_incremental |", False),
    "row_cost_bench.py": (["--rows", "3000", "--repeat", "1"], "| signatures |", False),
    "siblings_bench.py": (["--rows", "20000", "--siblings", "1,2", "--repeat", "1", "--out", "{tmp}/siblings.json"],
                          "| its refresh after a 0.1 % append |", False),
    "signature_bench.py": (["--rows", "1000"], "| int64 |", False),
    "sensor_refresh_bench.py": (["--appends", "1", "--rows", "5", "--table-rows", "20", "--sessions", "warm,load each time"],
                                "| load each time / warm (p50)", False),
    "step_start_bench.py": (["--rounds", "1", "--rows", "10"], "| spawn / forkserver", False),
    "worker_bench.py": (["--rows", "64", "--repeat", "1", "--big-rows", "2000"], "| engine / bare |", False),
}


def test_every_benchmark_script_is_covered():
    assert sorted(p.name for p in BENCH.glob("*.py")) == sorted(CASES)


@pytest.mark.parametrize("script", [pytest.param(name, marks=[pytest.mark.k8s] if CASES[name][2] else [])
                                    for name in sorted(CASES)])
def test_the_benchmark_runs_at_tiny_sizes(script, tmp_path):
    arguments, expected, _ = CASES[script]
    arguments = [a.replace("{tmp}", str(tmp_path)) for a in arguments]
    if any("/carry/" in a for a in arguments):  # the model the GPU benchmarks read, as bench/prepare_minilm_carry.py makes it
        subprocess.run([sys.executable, str(BENCH / "prepare_minilm_carry.py"), "--out", str(tmp_path / "carry")],
                       cwd=REPO, check=True, capture_output=True, timeout=540)
    log = tmp_path / "bench.log"
    process = processes.start([sys.executable, str(BENCH / script), *arguments], log=log, cwd=REPO,
                              env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        process.wait(timeout=540)  # generous: guards a hang on a loaded machine, times nothing
    except subprocess.TimeoutExpired:
        pass  # stopped below; the exit status says so
    finally:
        processes.stop(process, grace=10)
    output = Path(log).read_text(errors="replace")
    assert process.returncode == 0, f"{script} {' '.join(arguments)} exited {process.returncode}:\n{output[-4000:]}"
    assert expected in output, output[-4000:]
