"""Partitioned Functions as Dagster users run them: a partition's materialization refreshes its
slice of the table and nothing else, on real Lance tables (a local directory and the suite's
object store) and a real Dagster instance; keys and columns that cannot be a filter are refused
when the definitions load."""

from __future__ import annotations

import datetime
import logging
import os
import time
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa
import pytest

from dagster._core.test_utils import instance_for_test

from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster.assets.checks import function_checks
from gpufn_dagster.assets.triggers import table_sensor, unfilled_rows_sensor
from gpufn_dagster.assets.resources import LanceDBResource
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from gpufn_dagster import errors as gpufn_errors
from gpufn_dagster.errors import FunctionDefinitionError
from dagster._core.execution.backfill import BulkActionStatus
from dagster._daemon.backfill import execute_backfill_iteration
from dagster_graphql.client.query import LAUNCH_PARTITION_BACKFILL_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql

from gpufn_dagster.refresh.files import TableFiles
from tests.storages import STORAGES

from ..helpers import embedded, event_metadata
PARTITION_DEFS = Path(__file__).with_name("partition_defs.py")
REEXECUTE_BACKFILL = """mutation($params: ReexecutionParams!) { reexecutePartitionBackfill(reexecutionParams: $params) {
  __typename ... on LaunchBackfillSuccess { backfillId } ... on PythonError { message } } }"""

CALLED: list[int] = []
DAILY = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-05")
SOURCES = dg.StaticPartitionsDefinition(["news", "wiki", "it's"])
DAYS_20 = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-21")  # partition_defs.py's


@pytest.fixture(autouse=True)
def _reset():
    CALLED.clear()


def _day(i: int) -> datetime.date:
    return datetime.date(2026, 1, 1) + datetime.timedelta(days=i)


def _docs(db_uri: str, rows: int = 120) -> None:
    """Rows of four days and three sources interleaved in one fragment, then one fragment of day 3."""
    sources = ["news", "wiki", "it's"]
    table = pa.table({"id": list(range(rows)), "day": [_day(i % 4) for i in range(rows)],
                      "source": [sources[i % 3] for i in range(rows)]})
    db = lancedb.connect(db_uri)
    created = db.create_table("docs", table, storage_options=STABLE_ROW_IDS)
    created.add(pa.table({"id": [1000, 1001], "day": [_day(3)] * 2, "source": ["news", "wiki"]}))


@gpu_function(table="docs", column="tenfold", output_type=pa.int64(), partitions_def=DAILY, partition_column="day")
def tenfold(id: pa.Array) -> pa.Array:  # noqa: A002 - the column's name
    CALLED.extend(id.to_pylist())
    return pa.compute.multiply(id, 10)


@gpu_function(table="docs", column="by_source", output_type=pa.int64(), partitions_def=SOURCES,
              partition_column="source", name="by_source")
def by_source(id: pa.Array) -> pa.Array:  # noqa: A002
    CALLED.extend(id.to_pylist())
    return pa.compute.add(id, 1)


def _column(db_uri: str, name: str, table: str = "docs") -> dict[int, int | None]:
    data = lancedb.connect(db_uri).open_table(table).to_lance().to_table(columns=["id", name]).to_pydict()
    return dict(zip(data["id"], data[name], strict=True))


def _materialize(db_uri: str, asset, partition_key: str, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    defs = build_definitions(assets=[asset], db_uri=db_uri)
    return dg.materialize(list(defs.assets), resources=defs.resources, instance=instance, partition_key=partition_key)


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_materializing_a_partition_refreshes_its_slice_and_nothing_else(db_uri):
    _docs(db_uri)
    instance = dg.DagsterInstance.ephemeral()
    result = _materialize(db_uri, tenfold, "2026-01-02", instance)
    day1 = [i for i in range(120) if i % 4 == 1]
    assert sorted(CALLED) == day1
    assert {k: v for k, v in _column(db_uri, "tenfold").items() if v is not None} == {i: 10 * i for i in day1}
    event = result.get_asset_materialization_events()[0]
    assert event.partition == "2026-01-02"
    metadata = {k: v.value for k, v in event.materialization.metadata.items()}
    assert metadata["rows_computed"] == metadata["rows_checked"] == len(day1)
    assert metadata["partition_filter"] == "`day` >= date '2026-01-02' AND `day` < date '2026-01-03'"

    CALLED.clear()  # day 3: its rows in the mixed fragment and its own fragment
    _materialize(db_uri, tenfold, "2026-01-04", instance)
    assert sorted(CALLED) == [i for i in range(120) if i % 4 == 3] + [1000, 1001]
    CALLED.clear()  # again: nothing stale in the slice, nothing computed
    again = _materialize(db_uri, tenfold, "2026-01-02", instance)
    assert CALLED == [] and {k: v.value for k, v in again.get_asset_materialization_events()[0]
                             .materialization.metadata.items()}["rows_computed"] == 0
    status = instance.get_status_by_partition(tenfold.key, DAILY.get_partition_keys(), DAILY)
    assert {k for k, s in status.items() if s == dg.AssetPartitionStatus.MATERIALIZED} == {"2026-01-02", "2026-01-04"}


def test_static_keys_are_quoted_and_slices_of_one_fragment_keep_each_others_rows(db_uri):
    _docs(db_uri)
    instance = dg.DagsterInstance.ephemeral()
    for key in ("it's", "news"):
        _materialize(db_uri, by_source, key, instance)
    done = [i for i in range(120) if i % 3 in (0, 2)] + [1000]
    assert sorted(CALLED) == sorted(done)
    assert {k: v for k, v in _column(db_uri, "by_source").items() if v is not None} == {i: i + 1 for i in done}


def test_a_partition_column_the_table_lacks_or_cannot_hold_is_refused_at_load(db_uri):
    _docs(db_uri)

    @gpu_function(table="docs", column="x", output_type=pa.int64(), partitions_def=DAILY, partition_column="dy",
                  name="typo")
    def typo(id: pa.Array) -> pa.Array:  # noqa: A002
        return id

    @gpu_function(table="docs", column="y", output_type=pa.int64(), partitions_def=DAILY, partition_column="id",
                  name="wrong_type")
    def wrong_type(id: pa.Array) -> pa.Array:  # noqa: A002
        return id

    @gpu_function(table="docs", column="z", output_type=pa.int64(), name="not_numbers",
                  partitions_def=dg.StaticPartitionsDefinition(["1", "two"]), partition_column="id")
    def not_numbers(id: pa.Array) -> pa.Array:  # noqa: A002
        return id

    with pytest.raises(FunctionDefinitionError) as err:
        build_definitions(assets=[typo, wrong_type, not_numbers], db_uri=db_uri)
    message = str(err.value)
    assert "Function 'typo': field 'partition_column': table has no column 'dy'" in message
    assert "Function 'wrong_type': field 'partition_column': column 'id' is int64: time-window partitions need" in message
    assert "Function 'not_numbers': field 'partition_column': partition key 'two' cannot be written" in message
    with pytest.raises(FunctionDefinitionError, match="field 'partition_column': a partitioned Function names"):
        gpu_function(table="docs", column="w", output_type=pa.int64(), partitions_def=DAILY)(lambda id: id)
    with pytest.raises(FunctionDefinitionError, match=r"field 'partition_filter': 'day = \{start\}' uses a placeholder"):
        gpu_function(table="docs", column="w", output_type=pa.int64(), partitions_def=SOURCES,
                     partition_filter="day = {start}")(lambda id: id)
    monthly = gpu_function(table="docs", column="m", output_type=pa.int64(), name="monthly", partition_column="day",
                           partitions_def=dg.MonthlyPartitionsDefinition("2026-01-01"))(lambda id: id)
    with pytest.raises(FunctionDefinitionError, match="Functions 'docs__tenfold' and 'monthly': field 'partitions_def': "
                       "both partition table 'docs' by day but with different partitions definitions"):
        build_definitions(assets=[tenfold, monthly], db_uri=db_uri)


NUMBERS = dg.DynamicPartitionsDefinition(name="numbers")


@gpu_function(table="docs", column="by_number", output_type=pa.int64(), partitions_def=NUMBERS, partition_column="id",
              name="by_number")
def by_number(id: pa.Array) -> pa.Array:  # noqa: A002
    CALLED.extend(id.to_pylist())
    return pa.compute.add(id, 100)


def test_an_integer_key_spelled_otherwise_is_refused_at_load_or_when_its_run_starts_never_sharing_a_slice(db_uri):
    """`int()` reads "+10", "1_0" and " 10" as 10: before, each of those keys selected key "10"'s rows."""
    _docs(db_uri)

    @gpu_function(table="docs", column="s", output_type=pa.int64(), name="static_numbers", partition_column="id",
                  partitions_def=dg.StaticPartitionsDefinition(["10", "+10", " 10", "11"]))
    def static_numbers(id: pa.Array) -> pa.Array:  # noqa: A002
        return id

    with pytest.raises(FunctionDefinitionError) as err:  # static keys: when the definitions load
        build_definitions(assets=[static_numbers], db_uri=db_uri)
    refused = [line.split("partition key ")[1].split(" cannot")[0] for line in str(err.value).splitlines()]
    assert refused == ["'+10'", "' 10'"], str(err.value)
    assert all(line.startswith("Function 'static_numbers': field 'partition_column': ")
               for line in str(err.value).splitlines())

    # Dynamic keys: when a run of one starts, before the Function computes anything.
    instance = dg.DagsterInstance.ephemeral()
    instance.add_dynamic_partitions("numbers", ["10", "1_0"])
    defs = build_definitions(assets=[by_number], db_uri=db_uri)
    failed = dg.materialize(list(defs.assets), resources=defs.resources, instance=instance, partition_key="1_0",
                            raise_on_error=False)
    (failure,) = failed.get_step_failure_events()
    error = failure.event_specific_data.error.cause
    assert issubclass(getattr(gpufn_errors, error.cls_name), FunctionDefinitionError), error.cls_name
    assert error.message.split(": ", 1)[1].startswith(
        "Function 'by_number': field 'partition_column': partition key '1_0' cannot be written as a filter on "
        "column 'id' (int64)"), error.message
    assert CALLED == [] and "by_number" not in lancedb.connect(db_uri).open_table("docs").schema.names
    _materialize(db_uri, by_number, "10", instance)
    assert CALLED == [10] and {k: v for k, v in _column(db_uri, "by_number").items() if v is not None} == {10: 110}


# --- backfills through Dagster's own daemons ---


def _events(db_uri: str, per_day: int = 5) -> None:
    days = [DAYS_20.time_window_for_partition_key(k).start.date() for k in DAYS_20.get_partition_keys()]
    lancedb.connect(db_uri).create_table("events", pa.table(
        {"id": list(range(per_day * len(days))), "day": [d for d in days for _ in range(per_day)]}),
        storage_options=STABLE_ROW_IDS)


def _backfill(workspace, asset: str, keys: list[str]) -> str:
    result = execute_dagster_graphql(workspace.create_request_context(), LAUNCH_PARTITION_BACKFILL_MUTATION, variables={
        "backfillParams": {"assetSelection": [{"path": [asset]}], "partitionNames": keys, "fromFailure": False}})
    launched = result.data["launchPartitionBackfill"]
    assert launched["__typename"] == "LaunchBackfillSuccess", launched
    return launched["backfillId"]


def _drive(instance, workspace, queue_pass, backfill_id: str, runs: int, watch=lambda: None) -> list:
    """Dagster's backfill daemon and queue daemon, one pass each at a time, until the backfill's runs end."""
    logger = logging.getLogger("backfill-test")
    deadline = time.monotonic() + 600  # a hang guard only

    def ended():
        found = instance.get_runs(filters=dg.RunsFilter(tags={"dagster/backfill": backfill_id}))
        return found if len(found) == runs and all(r.is_finished for r in found) else None

    while (finished := ended()) is None:
        assert time.monotonic() < deadline, "the backfill's runs did not end in 10 minutes"
        list(execute_backfill_iteration(workspace, logger))
        queue_pass()
        watch()
        time.sleep(0.5)
    # the backfill daemon marks the backfill ended on its next pass after its runs end
    while instance.get_backfill(backfill_id).status == BulkActionStatus.REQUESTED:
        assert time.monotonic() < deadline, "the backfill did not end in 10 minutes"
        list(execute_backfill_iteration(workspace, logger))
        time.sleep(0.5)
    return finished


def test_a_backfill_of_20_partitions_runs_two_at_a_time_on_two_local_slots_and_the_others_say_they_wait(
        tmp_path, monkeypatch, classes_dir):
    _events(str(tmp_path / "lancedb"))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=PARTITION_DEFS, local={"slots": 2}) as (
            instance, workspace, queue_pass, _open_gate):
        backfill_id = _backfill(workspace, "events__double", DAYS_20.get_partition_keys())
        holding: list[int] = []
        runs = _drive(instance, workspace, queue_pass, backfill_id, 20, watch=lambda: holding.append(len(
            instance.event_log_storage.get_concurrency_info("gpu-default").claimed_slots)))
        assert [r.status for r in runs] == [dg.DagsterRunStatus.SUCCESS] * 20
        assert max(holding) == 2  # two at once, never more
        said = {r.run_id: [m for m in event_metadata(instance, r.run_id) if "Local slots" in m] for r in runs}
        waited = {run_id: lines for run_id, lines in said.items() if lines}
        assert len(waited) >= 8, said  # ten runs start at once (max_concurrent_runs), two slots
        assert all(m["GPU class"] == "default" and m["Local slots"] == 2 and " of " in m["Position"]
                   for lines in waited.values() for m in lines)
        table = lancedb.connect(str(tmp_path / "lancedb")).open_table("events").to_lance().to_table(
            columns=["id", "double"]).to_pydict()
        assert table["double"] == [2 * i for i in table["id"]]
        status = instance.get_status_by_partition(dg.AssetKey("events__double"), DAYS_20.get_partition_keys(), DAYS_20)
        assert set(status.values()) == {dg.AssetPartitionStatus.MATERIALIZED}


def test_a_single_run_backfill_is_one_run_whose_refresh_fans_out_and_commits_once(tmp_path, monkeypatch, classes_dir):
    _events(str(tmp_path / "lancedb"), per_day=300)  # 3,000 rows in the range: enough for two shards
    with embedded(tmp_path, monkeypatch, classes_dir, defs=PARTITION_DEFS, local={"slots": 2}) as (
            instance, workspace, queue_pass, _open_gate):
        keys = DAYS_20.get_partition_keys()[2:12]
        before = TableFiles(str(tmp_path / "lancedb" / "events.lance")).dataset().version
        (run,) = _drive(instance, workspace, queue_pass, _backfill(workspace, "events__triple", keys), 1)
        assert run.status == dg.DagsterRunStatus.SUCCESS, run.status
        shards = {e.step_key for e in instance.all_logs(run.run_id, of_type=dg.DagsterEventType.STEP_SUCCESS)
                  if "shard" in (e.step_key or "")}
        assert len(shards) == 2
        table = TableFiles(str(tmp_path / "lancedb" / "events.lance")).dataset()
        # the columns added, then one commit of the range's rows
        assert table.version == before + 2
        data = table.to_table(columns=["id", "triple"]).to_pydict()
        assert {i: v for i, v in zip(data["id"], data["triple"], strict=True) if v is not None} == {
            i: 3 * i for i in range(600, 3600)}
        status = instance.get_status_by_partition(dg.AssetKey("events__triple"), DAYS_20.get_partition_keys(), DAYS_20)
        assert {k for k, s in status.items() if s == dg.AssetPartitionStatus.MATERIALIZED} == set(keys)
        # each partition's materialization says its own rows and filter, not the range's
        records = instance.fetch_materializations(dg.AssetKey("events__triple"), limit=100).records
        own = {r.asset_materialization.partition: {k: v.value for k, v in r.asset_materialization.metadata.items()}
               for r in records}
        assert sorted(own) == keys
        assert {k: (m["rows_checked"], m["rows_computed"], m["rows_failed"]) for k, m in own.items()} == \
            dict.fromkeys(keys, (300, 300, 0))
        assert all(key in m["partition_filter"] and len(m["partition_filter"]) < 80 for key, m in own.items())


# --- sensors: one run per changed partition ---


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_an_append_into_one_partition_requests_that_partition_only_and_its_run_computes_only_it(db_uri):
    _docs(db_uri)
    sensor = table_sensor("docs", [tenfold])
    unfilled = unfilled_rows_sensor(tenfold, threshold=1)
    defs = build_definitions(assets=[tenfold], sensors=[sensor, unfilled], db_uri=db_uri)
    repository = defs.get_repository_def()
    with instance_for_test() as instance:
        def tick(which: dg.SensorDefinition, cursor: str | None):
            return which.evaluate_tick(dg.build_sensor_context(
                instance=instance, cursor=cursor, repository_def=repository,
                resources={"lancedb": LanceDBResource(uri=db_uri)}))

        first = tick(sensor, None)  # nothing computed yet: every partition holding rows
        assert [r.partition_key for r in first.run_requests] == ["2026-01-01", "2026-01-02", "2026-01-03",
                                                                 "2026-01-04"]
        for key in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
            _materialize(db_uri, tenfold, key, instance)
        refreshed = tick(sensor, first.cursor)  # the refreshes' own commits change no rows
        assert not refreshed.run_requests and "changed no rows" in refreshed.skip_message

        table = lancedb.connect(db_uri).open_table("docs")
        table.add(pa.table({"id": [2000, 2001], "day": [_day(2)] * 2, "source": ["news"] * 2}))
        version = table.version
        appended = tick(sensor, refreshed.cursor)
        assert [(r.partition_key, r.run_key) for r in appended.run_requests] == [
            ("2026-01-03", f"docs@v{version}:2026-01-03")]
        assert [r.partition_key for r in tick(unfilled, None).run_requests] == ["2026-01-03"]
        CALLED.clear()
        _materialize(db_uri, tenfold, appended.run_requests[0].partition_key, instance)
        assert sorted(CALLED) == [2000, 2001]

        table.update(where="id = 5", values_sql={"id": "id + 5000"})  # day 2026-01-02 (5 % 4 == 1)
        updated = tick(sensor, appended.cursor)
        assert [r.partition_key for r in updated.run_requests] == ["2026-01-02"]
        CALLED.clear()
        _materialize(db_uri, tenfold, "2026-01-02", instance)
        assert CALLED == [5005]


PARTITION_SENSOR_DEFS = Path(__file__).with_name("partition_sensor_defs.py")
STALE_QUERY = """query($key: AssetKeyInput!, $partitions: [String!]) { assetNodeOrError(assetKey: $key) {
  ... on AssetNode { staleStatusByPartition(partitions: $partitions)
                     staleCausesByPartition(partitions: $partitions) { key { path } reason dependency { path } } } } }"""


def test_a_partition_whose_rows_changed_shows_unsynced_until_its_refresh_and_the_others_stay_synced(
        tmp_path, monkeypatch, classes_dir):
    """The sensor daemon observes the changed day of the table's rows asset; the UI's query says that
    day of the Function is unsynced (naming the rows asset), the other days synced, and the day's
    run, started by the queue daemon, makes it synced again."""
    from dagster._core.test_utils import freeze_time
    from dagster._daemon.sensor import execute_sensor_iteration

    db_uri = str(tmp_path / "lancedb")
    days = ["2026-01-01", "2026-01-02", "2026-01-03"]
    notes = lancedb.connect(db_uri).create_table("notes", pa.table(
        {"id": list(range(6)), "day": [_day(i // 2) for i in range(6)]}), storage_options=STABLE_ROW_IDS)
    clock = [time.time()]
    key = dg.AssetKey("notes__plus_one")
    with embedded(tmp_path, monkeypatch, classes_dir, defs=PARTITION_SENSOR_DEFS) as (
            instance, workspace, queue_pass, _open_gate):
        def sensor_tick() -> list:
            clock[0] += 31
            with freeze_time(clock[0]):
                list(execute_sensor_iteration(workspace, logging.getLogger("sensor-test"), None, None))
            return instance.get_runs()

        def refreshed(runs: int) -> None:  # the queue daemon starts the requested runs; wait for them
            deadline = time.monotonic() + 300  # a hang guard only
            while not (len(found := instance.get_runs()) == runs and all(r.is_finished for r in found)):
                assert time.monotonic() < deadline, [r.status for r in found]
                queue_pass()
                time.sleep(0.5)
            assert {r.status for r in instance.get_runs()} == {dg.DagsterRunStatus.SUCCESS}

        def health() -> dict[str, tuple[str, list]]:
            node = execute_dagster_graphql(workspace.create_request_context(), STALE_QUERY, variables={
                "key": {"path": key.path}, "partitions": days}).data["assetNodeOrError"]
            return {day: (status, [(c["key"]["path"], c["reason"], (c["dependency"] or {}).get("path")) for c in causes])
                    for day, status, causes in zip(days, node["staleStatusByPartition"],
                                                   node["staleCausesByPartition"], strict=True)}

        assert sorted(r.tags["dagster/partition"] for r in sensor_tick()) == days  # first look: all unfilled
        refreshed(3)
        assert {day: status for day, (status, _) in health().items()} == dict.fromkeys(days, "FRESH")

        notes.add(pa.table({"id": [100], "day": [_day(1)]}))  # a row of 2026-01-02
        assert sorted(r.tags["dagster/partition"] for r in sensor_tick()) == sorted([*days, "2026-01-02"])
        now = health()
        assert now["2026-01-02"] == ("STALE", [(["notes_by_day"], "has a new data version", None)])
        assert now["2026-01-01"] == now["2026-01-03"] == ("FRESH", [])
        refreshed(4)
        assert {day: status for day, (status, _) in health().items()} == dict.fromkeys(days, "FRESH")
        assert _column(db_uri, "plus_one", "notes")[100] == 101


def test_asset_checks_of_a_partition_count_its_slice_only(db_uri):
    _docs(db_uri)
    checks = function_checks(tenfold)
    defs = build_definitions(assets=[tenfold], asset_checks=checks, db_uri=db_uri)
    instance = dg.DagsterInstance.ephemeral()
    result = dg.materialize([tenfold, *checks], resources=defs.resources, instance=instance, partition_key="2026-01-02")
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert evaluations["no_unfilled_rows"].passed  # the day-2 slice is filled; other days are not
    assert evaluations["no_unfilled_rows"].metadata["rows"].value == 30
    assert evaluations["no_unfilled_rows"].partition == "2026-01-02"
    # a row appended into 2026-01-02 does not fail the check of 2026-01-03, whose slice is filled
    lancedb.connect(db_uri).open_table("docs").add(pa.table({"id": [3000], "day": [_day(1)], "source": ["wiki"]}))
    other = dg.materialize([tenfold, *checks], resources=defs.resources, instance=instance, partition_key="2026-01-03")
    (evaluation,) = [e for e in other.get_asset_check_evaluations() if e.check_name == "no_unfilled_rows"]
    assert evaluation.passed and evaluation.partition == "2026-01-03" and evaluation.metadata["rows"].value == 30
    assert 3000 not in CALLED


@gpu_function(table="docs", column="plus_two", output_type=pa.int64(), name="plus_two")
def plus_two(id: pa.Array) -> pa.Array:  # noqa: A002
    CALLED.extend(id.to_pylist())
    return pa.compute.add(id, 2)


def test_a_pilot_refreshes_the_rows_of_its_filter_and_projects_the_rest_and_the_full_refresh_skips_them(db_uri):
    _docs(db_uri)
    defs = build_definitions(assets=[plus_two], db_uri=db_uri)
    instance = dg.DagsterInstance.ephemeral()
    pilot = dg.materialize([plus_two], resources=defs.resources, instance=instance,
                           run_config={"ops": {"plus_two": {"config": {"where": "source = 'wiki'"}}}})
    wiki = [i for i in range(120) if i % 3 == 1] + [1001]
    assert sorted(CALLED) == sorted(wiki)
    metadata = {k: v.value for k, v in pilot.get_asset_materialization_events()[0].materialization.metadata.items()}
    assert metadata["pilot_filter"] == "source = 'wiki'"
    assert metadata["projected_rows_left"] == 122 - len(wiki)
    assert metadata["projected_hours"] > 0
    CALLED.clear()
    dg.materialize([plus_two], resources=defs.resources, instance=instance)
    assert sorted(CALLED) == sorted(set(range(120)) - set(wiki) | {1000})
    with pytest.raises(dg.DagsterInvalidConfigError, match="where"):
        dg.materialize([tenfold], resources=defs.resources, instance=instance, partition_key="2026-01-02",
                       run_config={"ops": {"docs__tenfold": {"config": {"where": "id = 1"}}}})


def test_a_partition_whose_run_failed_shows_failed_and_re_executing_the_backfills_failures_runs_only_it(
        tmp_path, monkeypatch, classes_dir):
    _events(str(tmp_path / "lancedb"))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=PARTITION_DEFS, local={"slots": 2}) as (
            instance, workspace, queue_pass, _open_gate):
        keys = DAYS_20.get_partition_keys()[:4]
        first = _backfill(workspace, "events__plus_seven", keys)
        runs = _drive(instance, workspace, queue_pass, first, 4)
        failed = {r.tags["dagster/partition"] for r in runs if r.status == dg.DagsterRunStatus.FAILURE}
        assert failed == {"2026-01-02"}, [(r.tags["dagster/partition"], r.status) for r in runs]
        status = instance.get_status_by_partition(dg.AssetKey("events__plus_seven"), keys, DAYS_20)
        assert status["2026-01-02"] == dg.AssetPartitionStatus.FAILED
        assert {status[k] for k in keys if k != "2026-01-02"} == {dg.AssetPartitionStatus.MATERIALIZED}

        (Path(os.environ["GPUFN_TEST_GATES"]) / "fixed").touch()  # the model mended
        result = execute_dagster_graphql(workspace.create_request_context(), REEXECUTE_BACKFILL, variables={
            "params": {"parentRunId": first, "strategy": "FROM_FAILURE"}})
        retried = result.data["reexecutePartitionBackfill"]
        assert retried["__typename"] == "LaunchBackfillSuccess", retried
        (rerun,) = _drive(instance, workspace, queue_pass, retried["backfillId"], 1)
        assert (rerun.tags["dagster/partition"], rerun.status) == ("2026-01-02", dg.DagsterRunStatus.SUCCESS)
        records = instance.fetch_materializations(dg.AssetKey("events__plus_seven"), limit=10).records
        metadata = {r.event_log_entry.asset_materialization.partition: r.event_log_entry.asset_materialization.metadata
                    for r in records}
        assert metadata["2026-01-02"]["rows_computed"].value == 5  # that day's rows, no other's
        status = instance.get_status_by_partition(dg.AssetKey("events__plus_seven"), keys, DAYS_20)
        assert set(status.values()) == {dg.AssetPartitionStatus.MATERIALIZED}
