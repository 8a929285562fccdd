"""Schedules, table sensors and asset checks with a real Dagster instance and real Lance tables."""

from __future__ import annotations

import time
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa
import pytest
from dagster._core.test_utils import instance_for_test

from tests.storages import STORAGES
from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster.assets.checks import function_checks
from gpufn_dagster.assets.resources import STABLE_ROW_IDS, LanceDBResource
from gpufn_dagster.assets.triggers import refresh_schedule, table_sensor, unfilled_rows_sensor


def upper(text: str) -> str:
    return text.upper()


def flaky(text: str) -> str:
    if text.endswith("7"):
        raise ValueError("seven")
    return text


def add_docs(db_uri: str, start: int, rows: int) -> None:
    data = pa.table({"id": list(range(start, start + rows)), "text": [f"d{i}" for i in range(start, start + rows)]})
    db = lancedb.connect(db_uri)
    if "docs" in db.list_tables().tables:
        db.open_table("docs").add(data)
    else:
        db.create_table("docs", data, storage_options=STABLE_ROW_IDS)


@pytest.fixture
def upper_asset():
    return gpu_function(table="docs", column="up", gpu_class="l4")(upper)


def evaluate(sensor: dg.SensorDefinition, instance, db_uri: str, cursor: str | None):
    context = dg.build_sensor_context(instance=instance, cursor=cursor, resources={"lancedb": LanceDBResource(uri=db_uri)})
    return sensor.evaluate_tick(context)


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_sensor_requests_one_run_per_new_version_and_skips_its_own_refreshes(db_uri, upper_asset):
    add_docs(db_uri, 0, 10)
    sensor = table_sensor("docs", [upper_asset])
    with instance_for_test() as instance:
        first = evaluate(sensor, instance, db_uri, None)
        assert [r.run_key for r in first.run_requests] == ["docs@v1"]
        assert evaluate(sensor, instance, db_uri, first.cursor).skip_message.startswith("table 'docs' unchanged")

        # The refresh itself writes versions (column declaration, computed values): not a change.
        defs = build_definitions(assets=[upper_asset], db_uri=db_uri)
        assert dg.materialize([upper_asset], resources=defs.resources, instance=instance).success
        after_refresh = evaluate(sensor, instance, db_uri, first.cursor)
        assert not after_refresh.run_requests and "changed no rows" in after_refresh.skip_message

        # New rows: one run for the new version. A restart re-evaluates from the stored cursor.
        add_docs(db_uri, 10, 5)
        add_docs(db_uri, 15, 5)
        second = evaluate(sensor, instance, db_uri, after_refresh.cursor)
        version = lancedb.connect(db_uri).open_table("docs").version
        assert [r.run_key for r in second.run_requests] == [f"docs@v{version}"]
        assert second.cursor == str(version)
        # The table's own asset follows the table: its row count and version as they are now.
        (changed,) = second.asset_events
        assert changed.asset_key == dg.AssetKey("docs")
        assert (changed.metadata["dagster/row_count"].value, changed.metadata["table_version"].value) == (20, version)
        restarted = evaluate(table_sensor("docs", [upper_asset]), instance, db_uri, second.cursor)
        assert not restarted.run_requests

        lancedb.connect(db_uri).open_table("docs").delete("id = 3")
        third = evaluate(sensor, instance, db_uri, second.cursor)
        assert [r.run_key for r in third.run_requests] == [f"docs@v{version + 1}"]


def test_a_table_made_by_materialize_all_starts_no_second_refresh(db_uri, upper_asset):
    """Materialize all creates the table and refreshes its Functions; the sensor's first look at
    the table then finds every version covered and starts nothing -- until rows really change."""

    @dg.asset(name="docs")
    def docs_asset() -> None:
        add_docs(db_uri, 0, 10)

    defs = build_definitions(assets=[docs_asset, upper_asset], db_uri=db_uri)
    sensor = table_sensor("docs", [upper_asset])
    with instance_for_test() as instance:
        assert dg.materialize(list(defs.assets), resources=defs.resources, instance=instance).success
        first = evaluate(sensor, instance, db_uri, None)
        version = lancedb.connect(db_uri).open_table("docs").version
        assert not first.run_requests and first.cursor == str(version), first.skip_message
        assert "already refreshed" in first.skip_message or "changed no rows" in first.skip_message
        add_docs(db_uri, 10, 5)
        second = evaluate(sensor, instance, db_uri, first.cursor)
        assert [r.run_key for r in second.run_requests] == [f"docs@v{version + 1}"]


def test_sensor_runs_go_through_the_daemon_without_duplicates(db_uri, monkeypatch):
    """The real sensor daemon path (code server, ticks, stored cursor): run keys dedupe across ticks."""
    from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time
    from dagster._core.workspace.load_target import PythonFileTarget
    from dagster._daemon.sensor import execute_sensor_iteration

    monkeypatch.setenv("GPUFN_LANCEDB_URI", db_uri)
    add_docs(db_uri, 0, 10)
    target = PythonFileTarget(python_file=str(Path(__file__).with_name("sensor_defs.py")), attribute="defs",
                              working_directory=None, location_name="sensor_test")

    clock = [time.time()]

    def tick(workspace, times: int = 2) -> None:
        for _ in range(times):
            clock[0] += 31  # past the sensor's minimum interval
            with freeze_time(clock[0]):
                list(execute_sensor_iteration(workspace, dg.get_dagster_logger(), None, None))

    with instance_for_test() as instance:
        with create_test_daemon_workspace_context(target, instance) as workspace:
            tick(workspace)
            assert [r.tags[".dagster/gpufn-table-version"] for r in instance.get_runs()] == ["1"]
            add_docs(db_uri, 10, 3)
            tick(workspace)  # the run for version 1 is still in progress: it may yet read version 2
            assert len(instance.get_runs()) == 1
            for run in instance.get_runs():  # it ends (failed here: no run worker executes it in this test)
                instance.report_run_failed(run, "no run worker in this test")
            tick(workspace)
        # A restarted daemon (new workspace) continues from the stored cursor.
        with create_test_daemon_workspace_context(target, instance) as workspace:
            tick(workspace)
        runs = instance.get_runs()
        assert sorted(r.tags[".dagster/gpufn-table-version"] for r in runs) == ["1", "2"]
        assert all(r.tags["gpufn/gpu-class"] == "l4" for r in runs)




def test_schedule_requests_a_run_of_its_functions_with_class_tags(upper_asset):
    schedule = refresh_schedule("nightly_refresh", "0 3 * * *", [upper_asset])
    defs = dg.Definitions(assets=[upper_asset], schedules=[schedule],
                          resources={"lancedb": LanceDBResource(uri="/unused")})
    job = defs.resolve_job_def("nightly_refresh_job")
    assert job.tags["gpufn/gpu-class"] == "l4"
    with instance_for_test() as instance:
        context = dg.build_schedule_context(instance=instance, scheduled_execution_time=None)
        (request,) = schedule.evaluate_tick(context).run_requests
    assert schedule.cron_schedule == "0 3 * * *"
    assert defs.resolve_implicit_global_asset_job_def() is not None and request is not None


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_asset_checks_report_unfilled_and_failed_rows(db_uri):
    add_docs(db_uri, 0, 30)
    asset = gpu_function(table="docs", column="maybe", on_error="skip")(flaky)
    checks = function_checks(asset, max_failed_fraction=0.05)
    defs = build_definitions(assets=[asset], asset_checks=checks, db_uri=db_uri)
    with instance_for_test() as instance:
        result = dg.materialize([asset, *checks], resources=defs.resources, instance=instance)
        outcomes = {e.check_name: e for e in result.get_asset_check_evaluations()}
        # The three failed rows have no value: they are unfilled, and failed.
        assert not outcomes["no_unfilled_rows"].passed
        assert outcomes["no_unfilled_rows"].metadata["failed_rows"].value == 3
        assert not outcomes["failed_rows_below_threshold"].passed  # d7, d17, d27 = 10 % > 5 %
        assert outcomes["failed_rows_below_threshold"].metadata["failed_rows"].value == 3
        # ...and named: which rows (stable row id, inputs), why, under which rule -- on the check and the materialization
        named = outcomes["failed_rows_below_threshold"].metadata["first_failed_rows"].value.records
        assert sorted(r.data["row_id"] for r in named) == [7, 17, 27]
        assert {r.data["error_class"] for r in named} == {"ValueError"} and {r.data["rule"] for r in named} == {"skip"}
        assert "gpufn_errors" in outcomes["failed_rows_below_threshold"].metadata["failed_rows_query"].value
        (event,) = result.get_asset_materialization_events()
        shown = event.materialization.metadata
        assert (shown["rows_computed"].value, shown["rows_failed"].value) == (27, 3)  # computed: given a value
        assert sorted((r.data["row_id"], r.data["inputs"]) for r in shown["failed_rows"].value.records) == [
            (7, "text='d7'"), (17, "text='d17'"), (27, "text='d27'")]

        add_docs(db_uri, 30, 4)
        check_only = dg.materialize([asset, *checks], selection=dg.AssetSelection.checks(*checks),
                                    resources=defs.resources, instance=instance)
        outcomes = {e.check_name: e for e in check_only.get_asset_check_evaluations()}
        unfilled = outcomes["no_unfilled_rows"]
        assert not unfilled.passed and unfilled.metadata["unfilled_rows"].value == 7
        assert unfilled.metadata["never_computed_rows"].value == 4
        # Failed rows are still counted by a later check: the table, not the last run, is the record.
        assert outcomes["failed_rows_below_threshold"].metadata["failed_rows"].value == 3


def test_unfilled_rows_sensor_waits_for_the_threshold(db_uri, upper_asset):
    add_docs(db_uri, 0, 10)
    sensor = unfilled_rows_sensor(upper_asset, threshold=20)
    with instance_for_test() as instance:
        skipped = evaluate(sensor, instance, db_uri, None)
        assert "10 unfilled rows in 'docs', below the threshold of 20" in skipped.skip_message
        add_docs(db_uri, 10, 15)
        (request,) = evaluate(sensor, instance, db_uri, None).run_requests
        assert request.tags[".dagster/gpufn-unfilled-rows"] == "25"
        defs = build_definitions(assets=[upper_asset], db_uri=db_uri)
        assert dg.materialize([upper_asset], resources=defs.resources, instance=instance).success
        assert "0 unfilled rows" in evaluate(sensor, instance, db_uri, None).skip_message


def _closure_function():
    def shout_closure(text: str) -> str:
        return text.upper()

    return shout_closure


def test_sensor_runs_small_appends_in_process_and_larger_changes_in_step_processes(db_uri, upper_asset):
    """Appends of at most `in_process_rows` rows ask gpufn's executor for `in_process`; more rows,
    a delete, or a GPU Function that cannot leave its step's process (a closure) do not."""
    add_docs(db_uri, 0, 10)
    closure = gpu_function(table="docs", column="closed", gpu_class="l4")(_closure_function())
    sensor = table_sensor("docs", [upper_asset], in_process_rows=5)
    closure_sensor = table_sensor("docs", [closure], name="closure_changed", in_process_rows=5)
    defs = build_definitions(assets=[upper_asset, closure], sensors=[sensor, closure_sensor], db_uri=db_uri)
    repository = defs.get_repository_def()

    def tick(which: dg.SensorDefinition, cursor: str) -> dg.RunRequest:
        context = dg.build_sensor_context(instance=instance, cursor=cursor, repository_def=repository,
                                          resources={"lancedb": LanceDBResource(uri=db_uri)})
        (request,) = which.evaluate_tick(context).run_requests
        return request

    with instance_for_test() as instance:
        version = lancedb.connect(db_uri).open_table("docs").version
        add_docs(db_uri, 10, 5)
        assert tick(sensor, str(version)).run_config == {"execution": {"config": {"in_process": True}}}
        assert tick(closure_sensor, str(version)).run_config == {}  # its closure would fail in the run worker
        add_docs(db_uri, 15, 1)
        assert tick(sensor, str(version)).run_config == {}  # 6 rows since the cursor, above 5
        version = lancedb.connect(db_uri).open_table("docs").version
        lancedb.connect(db_uri).open_table("docs").delete("id = 3")
        assert tick(sensor, str(version)).run_config == {}  # how many rows a delete touched is unknown
