"""Loading a code location reads its tables once, where it is defined; a run's worker and its step
processes open no table and no database to load it (issue 41 item 3); with a schemas state file
that `gpufn refresh-state` wrote, the code server opens none either.

The code location here has six Functions on two tables and counts, in every process that loads it,
the databases connected and the tables opened while `build_definitions` runs, with Dagster's load
type (a code server defines the location; run workers and step processes reconstruct it). Runs go
through the embedded launcher as `dagster dev` starts them: a warm run worker, a worker the code
server starts (`warm_run_workers: false`), steps forked from the worker's forkserver, and a run in
process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest
from dagster import DagsterEventType, DagsterRunStatus

from ..helpers import embedded, finish, said, submit

COUNTING_DEFS = '''
import json
import os

import lancedb
import lancedb.db
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext

from gpufn_dagster import build_definitions, gpu_function

connected, opened = [], []
real_connect, real_open = lancedb.connect, lancedb.db.LanceDBConnection.open_table


def counting_connect(*args, **kwargs):
    connected.append(str(args[0]) if args else "")
    return real_connect(*args, **kwargs)


def counting_open(self, name, *args, **kwargs):
    opened.append(name)
    return real_open(self, name, *args, **kwargs)


def upper(text: str) -> str:
    return text.upper()


def length(text: str) -> int:
    return len(text)


lancedb.connect, lancedb.db.LanceDBConnection.open_table = counting_connect, counting_open
try:
    defs = build_definitions(assets=[
        *(gpu_function(table="docs", column=f"upper_{i}")(upper) for i in range(4)),
        *(gpu_function(table="notes", column=f"length_{i}")(length) for i in range(2)),
    ], schemas_state=os.environ.get("GPUFN_TEST_STATE"))
finally:
    lancedb.connect, lancedb.db.LanceDBConnection.open_table = real_connect, real_open
with open(os.environ["GPUFN_TEST_LOADS"], "a") as log:
    log.write(json.dumps({"pid": os.getpid(), "load": DefinitionsLoadContext.get().load_type.value,
                          "connected": len(connected), "opened": opened}) + "\\n")
'''


def loads(path: Path) -> dict[int, list[dict]]:
    """Each process's loads of the code location, by pid."""
    by_pid: dict[int, list[dict]] = {}
    for line in path.read_text().splitlines():
        load = json.loads(line)
        by_pid.setdefault(load["pid"], []).append(load)
    return by_pid


def run_processes(instance, run_id: str) -> set[int]:
    """The run worker's pid and its step processes' (from the run's own events)."""
    pids = set()
    for event in instance.all_logs(run_id):
        if event.message and event.message.startswith("Started process for run (pid: "):
            pids.add(int(event.message.split("pid: ")[1].split(")")[0]))
        if event.dagster_event and event.dagster_event.event_type == DagsterEventType.STEP_WORKER_STARTED:
            pids.add(int(event.dagster_event.event_specific_data.metadata["pid"].value))
    return pids


@pytest.mark.parametrize("warm_run_workers", [True, False], ids=["warm run workers", "workers the code server starts"])
def test_runs_workers_and_steps_open_no_table_to_load_the_code_location(tmp_path, monkeypatch, classes_dir,
                                                                       warm_run_workers):
    defs = tmp_path / "counting_defs.py"
    defs.write_text(COUNTING_DEFS)
    log = tmp_path / "loads.jsonl"
    monkeypatch.setenv("GPUFN_TEST_LOADS", str(log))
    lancedb.connect(tmp_path / "lancedb").create_table("notes", pa.table({"id": [0, 1], "text": ["a", "bb"]}))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=defs, warm_run_workers=warm_run_workers) as (
            instance, workspace, queue_pass, _open):
        defined = [load for pid_loads in loads(log).values() for load in pid_loads]
        # The code server defined the location: six Functions, two tables, each opened once.
        assert [load["load"] for load in defined] == ["INITIALIZATION"], defined
        assert sorted(defined[0]["opened"]) == ["docs", "notes"] and defined[0]["connected"] == 1

        multiprocess = submit(workspace, "docs__upper_0", "docs__upper_1", "notes__length_0")
        assert finish(instance, queue_pass, multiprocess).status == DagsterRunStatus.SUCCESS
        second = submit(workspace, "notes__length_1")  # a warm worker started while the first ran
        assert finish(instance, queue_pass, second).status == DagsterRunStatus.SUCCESS
        if warm_run_workers:  # it ran in the worker that loaded ahead (with the same load data), not afresh
            assert "Handed to the warm run worker" in said(instance, second)
            assert "starts afresh" not in said(instance, second)
        in_process = submit(workspace, "docs__upper_2", run_config={"execution": {"config": {"in_process": True}}})
        assert finish(instance, queue_pass, in_process).status == DagsterRunStatus.SUCCESS

        by_pid = loads(log)
        processes = set().union(*(run_processes(instance, run) for run in (multiprocess, second, in_process)))
        assert len(processes) >= 6, processes  # 3 run workers, 4 steps forked or started (3 + 1)
        for pid in processes:
            assert pid in by_pid, f"process {pid} of a run did not load the code location"
            for load in by_pid[pid]:
                assert load == {"pid": pid, "load": "RECONSTRUCTION", "connected": 0, "opened": []}, load
        # What the runs computed: the load's schemas were the tables' own.
        db = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"])
        assert db.open_table("notes").to_arrow().column("length_0").to_pylist() == [1, 2]
        assert db.open_table("docs").to_arrow().column("upper_2").to_pylist() == [f"D{i}" for i in range(6)]


def test_a_code_server_given_the_state_gpufn_refresh_state_wrote_opens_no_table_and_its_runs_compute(
        tmp_path, monkeypatch, classes_dir):
    """The README's deploy step, `gpufn refresh-state -f definitions.py`, run as written where the
    code location is; the code server loading the location afterwards (a reload, as a deploy starts
    a new one) connects to no database and opens no table, and a run of it computes from the tables."""
    defs = tmp_path / "counting_defs.py"
    defs.write_text(COUNTING_DEFS)
    log = tmp_path / "loads.jsonl"
    monkeypatch.setenv("GPUFN_TEST_LOADS", str(log))
    monkeypatch.setenv("GPUFN_TEST_STATE", str(tmp_path / "schemas_state.json"))
    lancedb.connect(tmp_path / "lancedb").create_table("notes", pa.table({"id": [0, 1], "text": ["a", "bb"]}))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=defs) as (instance, workspace, queue_pass, _open):
        wrote = subprocess.run([str(Path(sys.executable).parent / "gpufn"), "refresh-state", "-f", defs.name],
                               cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert wrote.returncode == 0, wrote.stderr[-3000:]
        assert "the schemas of 2 table(s)" in wrote.stdout and "(docs, notes)" in wrote.stdout, wrote.stdout
        log.write_text("")
        workspace.reload_code_location("local_slots")
        defined = [load for pid_loads in loads(log).values() for load in pid_loads]
        assert [(load["load"], load["connected"], load["opened"]) for load in defined] == [("INITIALIZATION", 0, [])]

        run = submit(workspace, "docs__upper_0", "notes__length_0")
        assert finish(instance, queue_pass, run).status == DagsterRunStatus.SUCCESS
        db = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"])
        assert db.open_table("notes").to_arrow().column("length_0").to_pylist() == [1, 2]
        assert db.open_table("docs").to_arrow().column("upper_0").to_pylist() == [f"D{i}" for i in range(6)]
