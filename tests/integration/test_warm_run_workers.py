"""Warm run workers and runs whose steps run in their worker, in the embedded mode: the shipped
launcher (`GpuLocalRunLauncher`), the real queue daemon's passes, a real instance, real run workers.

A code location's next run worker is started before its run (its code loaded, its step forkserver
started); the run is handed to it and its steps fork from that forkserver. It never runs code that
changed since it loaded; terminating its run cancels it; none is left once the instance closes. A run
with `in_process` runs its steps in the worker itself, its GPU Functions on their slot's process.
"""

from __future__ import annotations

import os
from pathlib import Path

import lancedb
import pyarrow as pa
from dagster import DagsterEventType, DagsterRunStatus

from gpufn_dagster.embedded.procfs import alive, running_module, same_process, stat_fields
from gpufn_dagster.embedded.warm import host_processes
from gpufn_dagster.embedded.warm_worker import MODULE
from gpufn_dagster.tags import RUN_WORKER_TAG

from ..conftest import wait_for
from ..helpers import LOCAL_DEFS, docs_column as column, embedded, event_metadata, finish, said, submit

IN_PROCESS = {"execution": {"config": {"in_process": True}}}


def ready_worker(instance) -> object:
    """The launcher's one waiting warm worker, once it has loaded the code location."""
    launcher = instance.run_launcher
    wait_for(lambda: len(launcher.waiting) == 1 and launcher.waiting[0].ready(), timeout=180,
             what="the next warm run worker ready")
    return launcher.waiting[0]


def add_rows(start: int, rows: int) -> None:
    lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").add(
        pa.table({"id": list(range(start, start + rows)), "text": [f"d{i}" for i in range(start, start + rows)]}))




def test_a_run_starts_in_the_worker_started_before_it_and_its_steps_fork_from_that_workers_forkserver(
        tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir) as (instance, workspace, queue_pass, open_gate):
        first = submit(workspace, "docs__size")
        assert finish(instance, queue_pass, first).status == DagsterRunStatus.SUCCESS
        assert "No warm run worker of this code location was waiting" in said(instance, first)

        worker = ready_worker(instance)
        pid = worker.process.pid
        add_rows(6, 4)
        second = submit(workspace, "docs__slow")  # holds its step until the gate opens
        wait_for(lambda: (queue_pass(), (Path(os.environ["GPUFN_TEST_GATES"]) / "ticket-1").exists())[1],
                 timeout=180, what="docs__slow computing")
        run = instance.get_run_by_id(second)
        assert run.tags[RUN_WORKER_TAG] == worker.identity
        assert f"Started process for run (pid: {pid})." in said(instance, second)
        handed = [e for e in instance.all_logs(second) if e.message and "Handed to the warm run worker" in e.message]
        assert handed and handed[0].dagster_event.engine_event_data.metadata["Warm"].value == "True"
        # The step is a child of the forkserver the worker started before its run, not of one it started now.
        (step,) = [e for e in instance.all_logs(second, of_type=DagsterEventType.STEP_WORKER_STARTED)]
        step_pid = int(step.dagster_event.event_specific_data.metadata["pid"].value)
        server = int(stat_fields(step_pid)[1])
        assert int(stat_fields(server)[1]) == pid
        assert int(stat_fields(server)[19]) < int(stat_fields(step_pid)[19])
        assert [m for m in event_metadata(instance, second) if "Step forkserver started ahead" in m] == []
        open_gate(1)
        assert finish(instance, queue_pass, second).status == DagsterRunStatus.SUCCESS
        assert len(column("slow")) == 10 and all(value.startswith("D") for value in column("slow"))
        wait_for(lambda: not alive(pid), timeout=60, what="the run worker exited with its run")


MARK_DEFS = '''
from gpufn_dagster import build_definitions, gpu_function


def mark(text: str) -> str:
    return text + "{mark}"


marked = gpu_function(table="docs", column="marked")(mark)
defs = build_definitions(assets=[marked])
'''


def test_a_warm_worker_whose_code_changed_since_it_loaded_runs_the_new_code(tmp_path, monkeypatch, classes_dir):
    defs = tmp_path / "mark_defs.py"
    defs.write_text(MARK_DEFS.format(mark="!"))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=defs) as (instance, workspace, queue_pass, _open):
        first = submit(workspace, "docs__marked")
        assert finish(instance, queue_pass, first).status == DagsterRunStatus.SUCCESS
        assert column("marked") == [f"d{i}!" for i in range(6)]

        worker = ready_worker(instance)
        defs.write_text(MARK_DEFS.format(mark="?"))  # edited after the worker loaded it: a new Function version
        second = submit(workspace, "docs__marked")
        assert finish(instance, queue_pass, second).status == DagsterRunStatus.SUCCESS
        assert instance.get_run_by_id(second).tags[RUN_WORKER_TAG] == worker.identity
        assert "loaded the code before 1 of its files changed (mark_defs.py), so it starts afresh" in said(instance, second)
        assert column("marked") == [f"d{i}?" for i in range(6)]  # what a worker started now computes


def test_terminating_a_run_in_a_warm_worker_cancels_it_and_ends_its_processes(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir) as (instance, workspace, queue_pass, _open):
        run_id = submit(workspace, "docs__slow")
        wait_for(lambda: (queue_pass(), (Path(os.environ["GPUFN_TEST_GATES"]) / "ticket-1").exists())[1],
                 timeout=180, what="docs__slow computing")
        identity = instance.get_run_by_id(run_id).tags[RUN_WORKER_TAG]
        assert same_process(identity) is not None
        assert instance.run_launcher.terminate(run_id)
        wait_for(lambda: "received termination signal" in said(instance, run_id), timeout=60,
                 what="the run worker interrupted")
        run = finish(instance, queue_pass, run_id, timeout=120)  # the gate stays shut: the call in flight is stopped
        assert run.status == DagsterRunStatus.CANCELED
        wait_for(lambda: same_process(identity) is None, timeout=60, what="the run worker ended")
        assert not any(column("slow"))  # nothing committed by the canceled refresh
        assert not instance.run_launcher.terminate(run_id)  # ended: nothing to terminate


def test_no_warm_worker_outlives_its_instance(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir) as (instance, workspace, queue_pass, _open):
        assert finish(instance, queue_pass, submit(workspace, "docs__size")).status == DagsterRunStatus.SUCCESS
        waiting = ready_worker(instance).process.pid
        assert waiting in running_module(MODULE)
    wait_for(lambda: waiting not in running_module(MODULE), timeout=30, what="the waiting worker ended")


def test_a_run_that_starts_its_steps_otherwise_stops_the_forkserver_started_ahead(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir) as (instance, workspace, queue_pass, _open):
        assert finish(instance, queue_pass, submit(workspace, "docs__size")).status == DagsterRunStatus.SUCCESS
        ready_worker(instance)
        add_rows(6, 2)
        run_id = submit(workspace, "docs__size", run_config={"execution": {"config": {"start_method": {"spawn": {}}}}})
        assert finish(instance, queue_pass, run_id).status == DagsterRunStatus.SUCCESS
        (stopped,) = [m for m in event_metadata(instance, run_id) if "Step forkserver started ahead" in m]
        assert stopped["Step forkserver started ahead"] == "stopped" and "spawn" in stopped["Why"]
        assert column("size")[-2:] == [2, 2]


def test_a_run_in_process_computes_its_gpu_function_on_the_slots_process_and_its_cpu_steps_in_the_worker(
        tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir) as (instance, workspace, queue_pass, open_gate):
        (Path(os.environ["GPUFN_TEST_GATES"]) / "open-all").touch()
        run_id = submit(workspace, "docs__slow", "docs__size", run_config=IN_PROCESS)
        assert finish(instance, queue_pass, run_id).status == DagsterRunStatus.SUCCESS
        worker = same_process(instance.get_run_by_id(run_id).tags[RUN_WORKER_TAG])
        text = said(instance, run_id)
        pid = next(int(line.split("pid: ")[1].split(")")[0]) for line in text.splitlines()
                   if line.startswith("Started process for run"))
        assert f"Executing steps in process (pid: {pid})" in text
        assert not list(instance.all_logs(run_id, of_type=DagsterEventType.STEP_WORKER_STARTED))  # no step process
        # class default keeps no instance (idle: 0), yet the GPU Function computed in the slot's own process
        loaded = next(line for line in text.splitlines() if "docs__slow: loaded the instance anew" in line)
        host = int(loaded.split(" in process ")[1].split()[0])
        assert host != pid
        assert column("slow") == [f"D{i}@None" for i in range(6)] and column("size") == [2] * 6
        wait_for(lambda: not host_processes(Path(instance.root_directory)), timeout=30,
                 what="the slot's process ended after the step (idle: 0)")
        assert worker is None or worker == pid


def test_a_gpu_closure_cannot_run_in_process_and_says_what_to_do(tmp_path, monkeypatch, classes_dir):
    warm_defs = LOCAL_DEFS.with_name("warm_defs.py")
    for name in ("LOADS", "CALLS"):
        monkeypatch.setenv(f"GPUFN_TEST_{name}", str(tmp_path / name))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=warm_defs) as (instance, workspace, queue_pass, _open):
        run_id = submit(workspace, "docs__closure", run_config=IN_PROCESS)
        assert finish(instance, queue_pass, run_id).status == DagsterRunStatus.FAILURE
        (failure,) = instance.all_logs(run_id, of_type=DagsterEventType.STEP_FAILURE)
        error = failure.dagster_event.step_failure_data.error
        message = error.cause.message if error.cause else error.message  # Dagster wraps the op's exception
        assert "docs__closure: a GPU Function computes in its local slot's own process" in message
        assert "define it at a module's top level, or run without in_process" in message
