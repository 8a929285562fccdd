"""A code location for the partition health test: a daily-partitioned Function over table `notes`
(three days) and the table sensor that requests a run per changed day."""

import dagster as dg
import pyarrow as pa

from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster.assets.triggers import table_sensor

DAYS_3 = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-04")


def plus_one(id: pa.Array) -> pa.Array:  # noqa: A002 - the column's name
    return pa.compute.add(id, 1)


noted = gpu_function(table="notes", column="plus_one", output_type=pa.int64(), partitions_def=DAYS_3,
                     partition_column="day")(plus_one)
defs = build_definitions(assets=[noted], sensors=[table_sensor("notes", [noted], running=True,
                                                               minimum_interval_seconds=0)])
