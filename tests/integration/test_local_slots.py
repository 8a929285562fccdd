"""Embedded mode: a GPU run beyond its class's local slots waits in Dagster's queue (the real queue
daemon and real run workers), says why, and starts when the slot frees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import lancedb
import pyarrow as pa
import yaml
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_test_daemon_workspace_context, instance_for_test
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from gpufn_dagster.resources import STABLE_ROW_IDS

from ..conftest import wait_for

DEFS = Path(__file__).with_name("local_defs.py")


def submit(workspace, asset: str) -> str:
    context = workspace.create_request_context()
    result = execute_dagster_graphql(context, LAUNCH_PIPELINE_EXECUTION_MUTATION, variables={"executionParams": {
        "selector": {"repositoryLocationName": "local_slots", "repositoryName": "__repository__",
                     "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": [asset]}]},
        "mode": "default"}})
    launched = result.data["launchPipelineExecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    return launched["run"]["runId"]


def test_gpu_run_beyond_local_slots_waits_then_starts(tmp_path, monkeypatch, classes_dir):
    db_uri = str(tmp_path / "lancedb")
    monkeypatch.setenv("GPUFN_LANCEDB_URI", db_uri)
    monkeypatch.setenv("GPUFN_CLASSES_DIR", str(classes_dir))
    spec = yaml.safe_load((classes_dir / "default.yaml").read_text())
    spec["local"] = {"slots": 1, "devices": ["3"]}
    (classes_dir / "default.yaml").write_text(yaml.safe_dump(spec))
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": list(range(6)), "text": [f"d{i}" for i in range(6)]}),
                                         storage_options=STABLE_ROW_IDS)
    overrides = {"run_coordinator": {"module": "gpufn_dagster.local", "class": "GpuQueuedRunCoordinator",
                                     "config": {"classes_dir": str(classes_dir)}},
                 "run_launcher": {"module": "gpufn_dagster.local", "class": "LocalGpuRunLauncher"}}
    target = PythonFileTarget(python_file=str(DEFS), attribute="defs", working_directory=None,
                              location_name="local_slots")
    with instance_for_test(overrides=overrides) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)

        def dequeue() -> None:
            list(daemon.run_iteration(workspace))

        first = submit(workspace, "docs__slow")
        second = submit(workspace, "docs__slow")
        assert instance.get_run_by_id(first).tags["gpufn/gpu-class"] == "default"
        waiting = instance.get_run_by_id(second)
        assert waiting.tags["gpufn/capacity"] == "waiting"
        events = [e.message for e in instance.all_logs(second) if e.is_dagster_event and e.message]
        assert any("Waiting for a local GPU slot of class 'default': all 1 slot(s) in use" in m for m in events)

        # The operator's view on the command line.
        listed = subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", "capacity", "--json"], check=True,
                                capture_output=True, text=True, env={**os.environ, "DAGSTER_HOME": instance.root_directory})
        assert [r["run_id"] for r in json.loads(listed.stdout)["default"]] == [second]

        dequeue()
        wait_for(lambda: instance.get_run_by_id(first).status in (DagsterRunStatus.STARTED, DagsterRunStatus.SUCCESS),
                 timeout=60, what="first run started")
        dequeue()
        assert instance.get_run_by_id(second).status == DagsterRunStatus.QUEUED  # never failed, never on CPU

        wait_for(lambda: instance.get_run_by_id(first).status == DagsterRunStatus.SUCCESS, timeout=120,
                 what="first run done")
        deadline = time.monotonic() + 60
        while instance.get_run_by_id(second).status == DagsterRunStatus.QUEUED and time.monotonic() < deadline:
            dequeue()
            time.sleep(0.5)
        wait_for(lambda: instance.get_run_by_id(second).status == DagsterRunStatus.SUCCESS, timeout=120,
                 what="second run done")
        run = instance.get_run_by_id(second)
        assert run.tags["gpufn/capacity"] == "running" and run.tags["gpufn/local-slot"] == "0"
        # The queue's next pass says the present: both runs ended, so neither holds a slot any more.
        dequeue()
        assert {instance.get_run_by_id(r).tags["gpufn/capacity"] for r in (first, second)} == {"released"}
        assert instance.get_run_by_id(second).tags["gpufn/capacity-reason"] == "RunEnded"
        events = [e.message for e in instance.all_logs(second) if e.is_dagster_event and e.message]
        assert any("Got local GPU slot 0 of class 'default' after waiting" in m for m in events)
        logs = " ".join(e.user_message for e in instance.all_logs(first))
        assert "GPU class default x1" in logs
        # The Function ran with its slot's device visible (class default: local.devices = ["3"]).
        values = lancedb.connect(db_uri).open_table("docs").to_arrow().column("slow").to_pylist()
        assert values and all(v.endswith("@3") for v in values)


def _embedded(tmp_path, monkeypatch, classes_dir, **local):
    """An instance with the embedded coordinator, and class `default` given `local` settings."""
    db_uri = str(tmp_path / "lancedb")
    monkeypatch.setenv("GPUFN_LANCEDB_URI", db_uri)
    monkeypatch.setenv("GPUFN_CLASSES_DIR", str(classes_dir))
    spec = yaml.safe_load((classes_dir / "default.yaml").read_text())
    spec.update(local)
    (classes_dir / "default.yaml").write_text(yaml.safe_dump(spec))
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1], "text": ["d"]}), storage_options=STABLE_ROW_IDS)
    overrides = {"run_coordinator": {"module": "gpufn_dagster.local", "class": "GpuQueuedRunCoordinator",
                                     "config": {"classes_dir": str(classes_dir)}},
                 "run_launcher": {"module": "gpufn_dagster.local", "class": "LocalGpuRunLauncher"}}
    target = PythonFileTarget(python_file=str(DEFS), attribute="defs", working_directory=None,
                              location_name="local_slots")
    return instance_for_test(overrides=overrides), target


def test_a_class_without_local_slots_refuses_its_runs_at_once(tmp_path, monkeypatch, classes_dir):
    instance_cm, target = _embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 0})
    with instance_cm as instance, create_test_daemon_workspace_context(target, instance) as workspace:
        run = instance.get_run_by_id(submit(workspace, "docs__slow"))
        assert run.status == DagsterRunStatus.FAILURE  # not QUEUED forever
        events = " ".join(e.message for e in instance.all_logs(run.run_id) if e.is_dagster_event and e.message)
        assert "GPU class 'default' has local.slots: 0" in events


def test_a_local_wait_past_max_wait_fails_the_run(tmp_path, monkeypatch, classes_dir):
    instance_cm, target = _embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 1}, max_wait="2s")
    with instance_cm as instance, create_test_daemon_workspace_context(target, instance) as workspace:
        first = submit(workspace, "docs__slow")
        second = submit(workspace, "docs__slow")
        assert instance.get_run_by_id(second).tags["gpufn/capacity"] == "waiting"
        instance.run_coordinator.get_run_queue_config()  # a queue pass within max_wait: it keeps waiting
        assert instance.get_run_by_id(second).status == DagsterRunStatus.QUEUED
        time.sleep(2.5)
        instance.run_coordinator.get_run_queue_config()  # the queue daemon's next pass
        run = instance.get_run_by_id(second)
        assert run.status == DagsterRunStatus.FAILURE and run.tags["gpufn/capacity"] == "timed-out"
        assert run.tags["gpufn/capacity-reason"] == "MaxWaitExceeded"
        events = " ".join(e.message for e in instance.all_logs(second) if e.is_dagster_event and e.message)
        assert "Gave up waiting for a local GPU slot of class 'default' after" in events
        assert instance.get_run_by_id(first).status == DagsterRunStatus.QUEUED  # the one holding the slot is left be
