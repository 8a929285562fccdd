"""Terminating a GPU run mid-refresh in the embedded mode, as the UI's Terminate does (GraphQL
`terminateRun`): the Function's call in flight stops within seconds (not when the call would have
returned), the run is CANCELED, the class's slot and the column's lease are free for the next run
at once, nothing is committed, and re-executing the run recomputes no row that was checkpointed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dagster import DagsterRunStatus
from dagster_graphql.client.query import LAUNCH_PIPELINE_REEXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from gpufn_dagster.embedded.warm import host_processes

from ..conftest import wait_for
from ..helpers import docs_column as column, embedded, event_metadata, finish, said, submit

TERMINATE = """mutation($runId: String!) { terminateRun(runId: $runId) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }"""


def calls(gates: Path) -> list[str]:
    path = gates / "halting-calls"
    return path.read_text().split() if path.exists() else []


@pytest.mark.parametrize("warm", [{"idle": 0}, {"idle": 600}], ids=["instance-in-step", "warm-instance"])
def test_terminate_stops_the_call_frees_slot_and_lease_and_reexecute_recomputes_no_checkpointed_row(
        tmp_path, monkeypatch, classes_dir, warm):
    with embedded(tmp_path, monkeypatch, classes_dir, warm=warm) as (instance, workspace, queue_pass, _open):
        root = Path(instance.root_directory)
        try:
            check_cancel(instance, workspace, queue_pass, root, bool(warm["idle"]))
        finally:
            for pid in host_processes(root):  # a warm instance this test kept would outlive it (idle 10 min)
                os.kill(pid, signal.SIGTERM)
        wait_for(lambda: not host_processes(root), timeout=60, what="no instance process left")


def check_cancel(instance, workspace, queue_pass, root: Path, warm: bool) -> None:
    gates = Path(os.environ["GPUFN_TEST_GATES"])
    (gates / "halt-at").write_text("d4")  # rows d0..d5 in calls of 2: d0-d3 computed and checkpointed first
    run_id = submit(workspace, "docs__halted")
    wait_for(lambda: (queue_pass(), "d4" in calls(gates))[1], timeout=180, what="the refresh held at row d4")
    hosts = host_processes(root)

    asked = time.monotonic()
    answer = execute_dagster_graphql(workspace.create_request_context(), TERMINATE, variables={"runId": run_id})
    assert answer.data["terminateRun"]["__typename"] == "TerminateRunSuccess", answer.data
    run = finish(instance, queue_pass, run_id, timeout=120)  # the gate never opens: only the interrupt ends it
    stopped_after = time.monotonic() - asked
    assert run.status == DagsterRunStatus.CANCELED, said(instance, run_id)[-3000:]
    assert not any(column("halted"))  # nothing committed by the canceled refresh
    if warm:
        assert hosts and not set(hosts) & set(host_processes(root))  # its instance's process ended: GPU freed
    print(f"terminate -> CANCELED in {stopped_after:.1f} s")
    # Its page says what happened, as facts: who, what is kept, how to resume -- not a crash of the Function.
    (said_so,) = [e for e in event_metadata(instance, run_id) if "Rows checkpointed" in e]
    assert said_so["Rows checkpointed"] == 4 and said_so["Committed"] == "nothing"  # d0-d3, in calls of 2
    assert "termination request" in said_so["Terminated by"] and "re-execute" in said_so["Resume"]

    first = len(calls(gates))
    (gates / "halt-at").unlink()
    answer = execute_dagster_graphql(workspace.create_request_context(), LAUNCH_PIPELINE_REEXECUTION_MUTATION,
                                     variables={"reexecutionParams": {"parentRunId": run_id, "strategy": "ALL_STEPS"}})
    launched = answer.data["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    again = launched["run"]["runId"]
    # The slot and the lease were released: the re-execution starts and finishes at once.
    assert finish(instance, queue_pass, again, timeout=180).status == DagsterRunStatus.SUCCESS, said(instance, again)
    assert calls(gates)[first:] == ["d4", "d5"]  # d0-d3 came from the canceled run's checkpoints
    (materialized,) = [e.dagster_event.event_specific_data.materialization.metadata
                       for e in instance.all_logs(again) if e.dagster_event and e.dagster_event.is_step_materialization]
    assert (materialized["rows_computed"].value, materialized["rows_adopted"].value) == (2, 4)
    assert column("halted") == [f"D{i}" for i in range(6)]
