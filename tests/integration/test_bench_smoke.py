"""Every benchmark in bench/ still runs: each script at tiny sizes, as BENCHMARKS.md's commands
run it, so an argument or an import that no longer exists fails here, not on the next
measurement. Nothing is timed; a script passes when it exits 0 and prints its table.

The scripts run side by side, started together when the first of these tests runs, each test
waiting for its own: most of a script's time is waiting on the servers it starts (a control plane,
PostgreSQL, `dagster dev`), not the CPU, and one after another they took 17 of the suite's 41
minutes. Those that start a control plane run one at a time (`CONTROL_PLANE_AT_ONCE`), the
others `OTHERS_AT_ONCE` at a time beside them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
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


CONTROL_PLANE_AT_ONCE = 1  # each starts its own kube-apiserver, scheduler and KWOK (or SeaweedFS)
OTHERS_AT_ONCE = 2
DEADLINE = 540  # seconds a script may take: generous, it guards a hang on a loaded machine and times nothing


@dataclass
class Runs:
    """The selected scripts' runs: started at once, waited for one by one, all stopped at the end."""

    tmp: Path
    running: dict[str, subprocess.Popen] = field(default_factory=dict)
    stopping: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)  # a script starts, or the end stops all: not both
    results: dict[str, Future] = field(default_factory=dict)

    def run(self, script: str) -> tuple[int | None, str]:
        """(exit status, output) of one script at its tiny sizes, as the test of it used to run it."""
        tmp = self.tmp / script.removesuffix(".py")
        tmp.mkdir()
        arguments, _, _ = CASES[script]
        arguments = [a.replace("{tmp}", str(tmp)) for a in arguments]
        if any("/carry/" in a for a in arguments):  # the model the GPU benchmarks read, as bench/prepare_minilm_carry.py makes it
            subprocess.run([sys.executable, str(BENCH / "prepare_minilm_carry.py"), "--out", str(tmp / "carry")],
                           cwd=REPO, check=True, capture_output=True, timeout=DEADLINE)
        log = tmp / "bench.log"
        with self.lock:
            if self.stopping:
                return None, f"{script}: not started, the tests ended first"
            process = processes.start([sys.executable, str(BENCH / script), *arguments], log=log, cwd=REPO,
                                      env={**os.environ, "PYTHONUNBUFFERED": "1"})
            self.running[script] = process
        try:
            process.wait(timeout=DEADLINE)
        except subprocess.TimeoutExpired:
            pass  # stopped below; the exit status says so
        finally:
            processes.stop(process, grace=10)
            self.running.pop(script, None)
        return process.returncode, f"{script} {' '.join(arguments)}:\n" + log.read_text(errors="replace")


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """Every script this session selected, started side by side; each stopped when the module ends,
    pass or fail, so none outlives the tests."""
    selected = sorted({item.callspec.params["script"] for item in request.session.items
                       if item.path == Path(__file__) and hasattr(item, "callspec")})
    started = Runs(tmp_path_factory.mktemp("bench"))
    pools = (ThreadPoolExecutor(CONTROL_PLANE_AT_ONCE), ThreadPoolExecutor(OTHERS_AT_ONCE))
    try:
        for script in selected:
            started.results[script] = pools[0 if CASES[script][2] else 1].submit(started.run, script)
        yield started
    finally:
        with started.lock:
            started.stopping = True
            left = list(started.running.values())
        for pool in pools:
            pool.shutdown(wait=False, cancel_futures=True)
        for process in left:
            processes.stop(process, grace=10)
        for pool in pools:
            pool.shutdown(wait=True)


@pytest.mark.parametrize("script", [pytest.param(name, marks=[pytest.mark.k8s] if CASES[name][2] else [])
                                    for name in sorted(CASES)])
def test_the_benchmark_runs_at_tiny_sizes(script, runs):
    returncode, output = runs.results[script].result(timeout=len(CASES) * DEADLINE)
    assert returncode == 0, f"exited {returncode}: {output[-4000:]}"
    assert CASES[script][1] in output, output[-4000:]
