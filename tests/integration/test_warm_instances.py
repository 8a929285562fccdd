"""Warm Function instances in the embedded mode, with real run workers, the queue daemon's passes
and a real instance: a Function's loaded instance outlives its step and run, and the next step of
the same version on the same local slot hands it its calls instead of loading it again; two
versions never share one; an instance's crash fails only the step using it; an idle one ends."""

from __future__ import annotations

import importlib
import json
import os
from pathlib import Path

import lancedb
import numpy as np
import pyarrow as pa
import pytest
from dagster import DagsterEventType, DagsterRunStatus

from gpufn_dagster.embedded.warm import host_processes, registered, stop_hosts

from ..conftest import wait_for
from ..helpers import LOCAL_DEFS, embedded, submit

WARM_DEFS = LOCAL_DEFS.with_name("warm_defs.py")


@pytest.fixture
def warm(tmp_path, monkeypatch, classes_dir):
    """`embedded` over warm_defs with the given `local.warm`; yields (instance, run(asset) -> run,
    loads(), calls(), the slot's registry directory). Every warm process it started is ended after."""
    logs = {name: tmp_path / f"{name}.log" for name in ("loads", "calls")}
    monkeypatch.setenv("GPUFN_TEST_LOADS", str(logs["loads"]))
    monkeypatch.setenv("GPUFN_TEST_CALLS", str(logs["calls"]))
    monkeypatch.setenv("GPUFN_TEST_CRASHED", str(tmp_path / "crashed"))
    started = []

    def start(warm_block: dict, rows: int = 6):
        context = embedded(tmp_path, monkeypatch, classes_dir, rows=rows, defs=WARM_DEFS, warm=warm_block,
                           local={"slots": 1})
        instance, workspace, queue_pass, _open = context.__enter__()
        started.append((context, Path(instance.root_directory) / "gpufn-slots" / "warm"))

        def run(asset: str):
            run_id = submit(workspace, asset)

            def ended():
                queue_pass()
                return instance.get_run_by_id(run_id).is_finished

            wait_for(ended, timeout=300, what=f"run of {asset} ended")
            return instance.get_run_by_id(run_id)

        def lines(name: str) -> list[list[str]]:
            return [line.split("|") for line in logs[name].read_text().splitlines()] if logs[name].exists() else []

        return instance, run, lambda: lines("loads"), lambda: lines("calls"), started[-1][1]

    yield start
    for context, directory in started:
        stop_hosts(directory)
        context.__exit__(None, None, None)


def said(instance, run_id: str) -> str:
    return "\n".join(e.message for e in instance.all_logs(run_id) if e.message)


def materialized(instance, run_id: str) -> dict:
    (event,) = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    return {k: v.value for k, v in event.dagster_event.event_specific_data.materialization.metadata.items()}


def add_rows(start: int, rows: int) -> None:
    lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").add(
        pa.table({"id": list(range(start, start + rows)), "text": [f"d{i}" for i in range(start, start + rows)]}))


def column(name: str) -> dict[int, str]:
    table = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").to_arrow()
    return dict(zip(table.column("id").to_pylist(), table.column(name).to_pylist()))


def test_the_next_run_of_the_same_function_reuses_the_loaded_instance(warm, monkeypatch):
    monkeypatch.setenv("GPUFN_TEST_LOAD_SECONDS", "2")  # a model that takes a while to load
    instance, run, loads, calls, directory = warm({"idle": "300s"})
    first = run("docs__tagged")
    assert first.status == DagsterRunStatus.SUCCESS, said(instance, first.run_id)[-3000:]
    assert "loaded the instance anew (no instance of this version was warm" in said(instance, first.run_id)
    assert materialized(instance, first.run_id)["load_seconds"] >= 2.0
    ((host, tag),) = loads()
    assert tag == "v1" and {pid for pid, _ in calls()} == {host}  # computed by the warm process, not the step
    (record,) = registered(directory)
    assert record["pid"] == int(host) and record["function_name"] == "docs__tagged"
    assert host_processes(directory) == [int(host)]  # what the suite's end checks for strays

    add_rows(6, 4)
    second = run("docs__tagged")
    assert second.status == DagsterRunStatus.SUCCESS, said(instance, second.run_id)[-3000:]
    assert "reused the instance loaded at" in said(instance, second.run_id)
    meta = materialized(instance, second.run_id)
    assert meta["load_seconds"] == 0.0 and meta["rows_computed"] == 4
    assert len(loads()) == 1 and {pid for pid, _ in calls()} == {host}  # loaded once for both runs
    assert column("tagged") == {i: f"d{i}#v1" for i in range(10)}


def test_two_versions_never_share_an_instance_and_the_oldest_makes_room(warm):
    instance, run, loads, calls, directory = warm({"idle": "300s", "instances": 1})
    assert run("docs__tagged").status == DagsterRunStatus.SUCCESS
    (v1_host, _), = loads()
    other = run("docs__retagged")  # another version (its init differs) on the same slot
    assert other.status == DagsterRunStatus.SUCCESS, said(instance, other.run_id)[-3000:]
    assert "ended the warm instance of docs__tagged" in said(instance, other.run_id)
    (_, first), (v2_host, second) = loads()
    assert (first, second) == ("v1", "v2") and v2_host != v1_host
    wait_for(lambda: not Path(f"/proc/{v1_host}").exists(), timeout=30, what="the v1 instance's process ended")
    assert [r["function_name"] for r in registered(directory)] == ["docs__retagged"]
    assert column("tagged") == {i: f"d{i}#v1" for i in range(6)}
    assert column("retagged") == {i: f"d{i}#v2" for i in range(6)}


def test_a_slot_makes_room_only_among_its_own_instances(tmp_path, monkeypatch):
    """Two slots of one class keeping one instance each: the second slot's load leaves the first
    slot's instance (which a step beside it may be calling) alive, and both answer."""
    from gpufn_dagster import function_of
    from gpufn_dagster.classes import GpuClass
    from gpufn_dagster.refresh.execute import BatchFit, Rows
    from gpufn_dagster.refresh.progress import Progress
    from gpufn_dagster.embedded.warm import Slot, WarmInstance

    monkeypatch.setenv("GPUFN_LANCEDB_URI", str(tmp_path / "lancedb"))  # warm_defs' table, for its definitions
    lancedb.connect(tmp_path / "lancedb").create_table("docs", pa.table({"id": [0], "text": ["a"]}))
    monkeypatch.syspath_prepend(str(WARM_DEFS.parent))  # as a code location loads it
    warm_defs = importlib.import_module("warm_defs")

    monkeypatch.setenv("GPUFN_TEST_LOADS", str(tmp_path / "loads.log"))
    monkeypatch.setenv("GPUFN_TEST_CALLS", str(tmp_path / "calls.log"))
    one_each = GpuClass(name="default", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=1,
                        local={"slots": 2, "warm": {"idle": "300s", "instances": 1}})
    function, said = function_of(warm_defs.Tagged), []
    first, second = (WarmInstance(function, Slot(one_each, i, "", tmp_path / "warm"), said.append) for i in (0, 1))
    try:
        first.ready(Progress(), None)
        second.ready(Progress(), None)
        assert not any("to make room" in line for line in said), said
        assert sorted(r["slot"] for r in registered(tmp_path / "warm")) == [0, 1]
        batch = pa.record_batch({"text": ["a"]})
        for instance in (first, second):  # the first slot's instance still answers its step
            values, errors = instance.call(batch, Rows(np.array([0], dtype=np.uint64)), BatchFit())
            assert values.to_pylist() == ["a#v1"] and errors == []
    finally:
        first.close(), second.close()
        stop_hosts(tmp_path / "warm")


def test_a_crashed_instance_fails_only_the_step_using_it_and_the_next_loads_a_fresh_one(warm, monkeypatch):
    monkeypatch.setenv("GPUFN_TEST_CRASH_AT", "d7")
    instance, run, loads, calls, directory = warm({"idle": "300s"})
    assert run("docs__tagged").status == DagsterRunStatus.SUCCESS
    (host, _), = loads()
    add_rows(6, 4)
    crashed = run("docs__tagged")  # its warm process is killed during the call holding d7
    assert crashed.status == DagsterRunStatus.FAILURE
    (failure,) = instance.all_logs(crashed.run_id, of_type=DagsterEventType.STEP_FAILURE)
    text = failure.dagster_event.step_failure_data.error.to_string()
    assert f"its warm instance's process (pid {host}) on local slot 0 of class 'default' ended during a call" in text
    assert registered(directory) == []
    again = run("docs__tagged")
    assert again.status == DagsterRunStatus.SUCCESS, said(instance, again.run_id)[-3000:]
    (_, _), (fresh, _) = loads()
    assert fresh != host and column("tagged") == {i: f"d{i}#v1" for i in range(10)}


def test_an_instance_no_step_used_for_its_idle_time_ends(warm):
    instance, run, loads, calls, directory = warm({"idle": "2s"})
    assert run("docs__tagged").status == DagsterRunStatus.SUCCESS
    (host, _), = loads()
    wait_for(lambda: not Path(f"/proc/{host}").exists(), timeout=60, what="the idle instance's process ended")
    assert registered(directory) == []


def test_shards_of_one_run_on_the_same_slot_load_the_function_once(warm):
    instance, run, loads, calls, directory = warm({"idle": "300s"}, rows=3200)
    done = run("docs__spread")
    assert done.status == DagsterRunStatus.SUCCESS, said(instance, done.run_id)[-3000:]
    shards = {e.step_key for e in instance.all_logs(done.run_id, of_type=DagsterEventType.STEP_SUCCESS)
              if "_shard" in (e.step_key or "")}
    assert len(shards) == 3, shards  # three shard steps, one after another on the class's one slot
    assert [tag for _, tag in loads()] == ["s"]  # one load for the three
    assert said(instance, done.run_id).count("reused the instance loaded at") == 2
    assert column("spread") == {i: f"d{i}#s" for i in range(3200)}


def test_a_class_keeping_no_instances_loads_the_function_in_each_step(warm):
    instance, run, loads, calls, directory = warm({"idle": "0s"})
    done = run("docs__tagged")
    assert done.status == DagsterRunStatus.SUCCESS
    (step, _), = loads()
    assert {pid for pid, _ in calls()} == {step} and registered(directory) == []
    assert host_processes(directory) == []  # no process holds an instance beyond the step


def test_a_function_that_cannot_be_sent_to_another_process_loads_in_its_step_and_says_why(warm):
    instance, run, loads, calls, directory = warm({"idle": "300s"})
    done = run("docs__closure")  # its callable is a closure: not importable by name
    assert done.status == DagsterRunStatus.SUCCESS, said(instance, done.run_id)[-3000:]
    assert "docs__closure: loaded in this step, not kept warm: its callable cannot be sent" in said(instance, done.run_id)
    assert registered(directory) == [] and column("closure") == {i: f"d{i}!" for i in range(6)}


@pytest.mark.parametrize(("asset", "suffix"), [
    ("docs__tagged", "#v1"),      # @gpu_function on a class
    ("docs__marked", "#def"),     # @gpu_function on a def
    ("docs__retagged", "#v2"),    # gpu_function(...)(cls)
    ("docs__counted", None),      # a lancedb.udf
    ("docs__yamled", "#yaml"),    # a YAML FunctionColumn
])
def test_every_form_the_readme_writes_is_kept_warm(warm, asset, suffix):
    """The decorators rebind the module's name to the asset (or lancedb.udf to its wrapper): the
    callable still travels to its slot's process, and the next run reuses that process."""
    instance, run, loads, calls, directory = warm({"idle": "300s"})
    first = run(asset)
    assert first.status == DagsterRunStatus.SUCCESS, said(instance, first.run_id)[-3000:]
    (record,) = registered(directory)  # kept: loaded in a process of its own
    assert {int(pid) for pid, _ in calls()} == {record["pid"]}
    add_rows(6, 4)
    second = run(asset)
    assert second.status == DagsterRunStatus.SUCCESS, said(instance, second.run_id)[-3000:]
    meta = materialized(instance, second.run_id)
    assert meta["load_seconds"] == 0.0 and meta["rows_computed"] == 4
    assert {int(pid) for pid, _ in calls()} == {record["pid"]}  # the second run's rows too
    assert [r["pid"] for r in registered(directory)] == [record["pid"]]
    name = asset.split("__")[1]
    expected = {i: (len(f"d{i}") if suffix is None else f"d{i}{suffix}") for i in range(10)}
    assert column(name) == expected


def test_an_instance_never_serves_a_step_whose_settings_changed(warm, tmp_path, monkeypatch):
    """A `.env` value the Function's module reads when it loads changes between two runs: the Function
    version stays (it counts code, not values), but the next step loads a fresh instance, ends the
    outdated one, and computes with the new setting."""
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.setenv("DAGSTER_PROJECT_ENV_FILE_PATHS", json.dumps({"local_slots": str(project)}))
    (project / ".env").write_text("GPUFN_TEST_SETTING=first\n")
    instance, run, loads, calls, directory = warm({"idle": "300s"})
    first = run("docs__configured")
    assert first.status == DagsterRunStatus.SUCCESS, said(instance, first.run_id)[-3000:]
    (old,) = registered(directory)
    (project / ".env").write_text("GPUFN_TEST_SETTING=second\n")
    add_rows(6, 4)
    second = run("docs__configured")
    assert second.status == DagsterRunStatus.SUCCESS, said(instance, second.run_id)[-3000:]
    meta = [materialized(instance, r.run_id) for r in (first, second)]
    assert meta[0]["function_version"] == meta[1]["function_version"]
    (new,) = registered(directory)
    assert new["pid"] != old["pid"] and new["settings"] != old["settings"]
    wait_for(lambda: not Path(f"/proc/{old['pid']}").exists(), timeout=30, what="the outdated instance ended")
    assert column("configured") == {**{i: f"d{i}#first" for i in range(6)}, **{i: f"d{i}#second" for i in range(6, 10)}}
