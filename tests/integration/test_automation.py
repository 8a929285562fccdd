"""Dagster's declarative automation drives GPU refreshes: a Function declared with
`automation_condition=AutomationCondition.eager()` is refreshed by Dagster's own automation sensor
when rows are added to its table outside Dagster (no gpufn sensor), once per change, through the
embedded queue and run workers; a partitioned one per changed partition."""

from __future__ import annotations

import datetime
import logging
import time
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa

from gpufn_dagster.assets.resources import STABLE_ROW_IDS

from ..helpers import embedded

AUTOMATION_DEFS = Path(__file__).with_name("automation_defs.py")


def _day(i: int) -> datetime.date:
    return datetime.date(2026, 1, 1) + datetime.timedelta(days=i)


def test_new_rows_lead_dagsters_automation_to_request_the_refresh_once_per_change(tmp_path, monkeypatch, classes_dir):
    from dagster._core.execution.backfill import BulkActionStatus
    from dagster._core.test_utils import freeze_time
    from dagster._daemon.asset_daemon import AssetDaemon
    from dagster._daemon.backfill import execute_backfill_iteration

    db_uri = tmp_path / "lancedb"
    notes = lancedb.connect(db_uri).create_table("notes", pa.table(
        {"id": list(range(6)), "day": [_day(i // 2) for i in range(6)]}), storage_options=STABLE_ROW_IDS)
    clock = [time.time()]
    with embedded(tmp_path, monkeypatch, classes_dir, defs=AUTOMATION_DEFS) as (instance, workspace, queue_pass, _):
        daemon = AssetDaemon(settings=instance.get_auto_materialize_settings(), pre_sensor_interval_seconds=0)

        def column(table: str, name: str) -> dict:
            data = lancedb.connect(db_uri).open_table(table).to_lance().to_table(columns=["id", name]).to_pydict()
            return dict(zip(data["id"], data[name]))

        def evaluate() -> list[dg.DagsterRun]:
            """One tick of Dagster's automation sensor a minute later; the runs it requested (partitions
            as a backfill, which the backfill daemon launches), once finished."""
            before = {r.run_id for r in instance.get_runs()}
            backfills = {b.backfill_id for b in instance.get_backfills()}
            clock[0] += 61  # past the sensor's interval and the next cron tick of the observations
            with freeze_time(clock[0]):
                daemon._run_iteration_impl(workspace, threadpool_executor=None, amp_tick_futures={},
                                           debug_crash_flags={})
            new_backfills = [b.backfill_id for b in instance.get_backfills() if b.backfill_id not in backfills]
            deadline = time.monotonic() + 300  # a hang guard only
            while True:
                requested = [r for r in instance.get_runs() if r.run_id not in before]
                if all(r.is_finished for r in requested) and all(
                        instance.get_backfill(b).status != BulkActionStatus.REQUESTED for b in new_backfills):
                    break
                assert time.monotonic() < deadline, [r.status for r in requested]
                list(execute_backfill_iteration(workspace, logging.getLogger("backfills")))
                queue_pass()
                time.sleep(0.5)
            runs = requested
            assert {r.status for r in runs} <= {dg.DagsterRunStatus.SUCCESS}, [(r.asset_selection, r.status) for r in runs]
            return runs

        def refreshes(runs: list[dg.DagsterRun]) -> list[tuple[str, str | None]]:
            """The Function refreshes among the runs (not the table observations): (asset, partition)."""
            return sorted((key.to_user_string(), r.tags.get("dagster/partition")) for r in runs
                          for key in r.asset_selection or () if "__" in key.to_user_string())

        requested = []
        for _ in range(3):  # the first look, the first observation of the tables, the refreshes they lead to
            requested += refreshes(evaluate())
        assert sorted(requested) == [("docs__upper", None), *[("notes__plus_one", str(_day(i))) for i in range(3)]]
        assert column("docs", "upper") == {i: f"D{i}" for i in range(6)}

        assert refreshes(evaluate()) == []  # its own refreshes' commits are no change of the table's rows
        lancedb.connect(db_uri).open_table("docs").add(pa.table({"id": [6, 7], "text": ["d6", "d7"]}))
        notes.add(pa.table({"id": [100], "day": [_day(1)]}))  # a row of 2026-01-02
        requested = refreshes(evaluate()) + refreshes(evaluate())  # observed, then requested
        assert requested == [("docs__upper", None), ("notes__plus_one", "2026-01-02")]
        assert refreshes(evaluate()) == []  # once per change
        assert column("docs", "upper") == {i: f"D{i}" for i in range(8)}
        assert column("notes", "plus_one") == {**{i: i + 1 for i in range(6)}, 100: 101}
