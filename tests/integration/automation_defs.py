"""A code location driven by Dagster's declarative automation alone (no gpufn sensor): a GPU
Function on table `docs` and a daily-partitioned one on table `notes` (three days), both
`AutomationCondition.eager()` (the partitioned one without eager's latest-time-window limit, so
every changed day refreshes), and Dagster's automation sensor, running."""

import dagster as dg
import pyarrow as pa

from gpufn_dagster import build_definitions, gpu_function

DAYS_3 = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-04")


@gpu_function(table="docs", column="upper", gpu_class="default", automation_condition=dg.AutomationCondition.eager())
def upper(text: str) -> str:
    return text.upper()


EVERY_CHANGED_DAY = dg.AutomationCondition.eager().without(dg.AutomationCondition.in_latest_time_window())


@gpu_function(table="notes", column="plus_one", output_type=pa.int64(), partitions_def=DAYS_3, partition_column="day",
              automation_condition=EVERY_CHANGED_DAY)
def plus_one(id: pa.Array) -> pa.Array:  # noqa: A002 - the column's name
    return pa.compute.add(id, 1)


defs = build_definitions(assets=[upper, plus_one], sensors=[dg.AutomationConditionSensorDefinition(
    "automation", target=dg.AssetSelection.all(include_sources=True), default_status=dg.DefaultSensorStatus.RUNNING)])
