"""A code location for the backfill tests: a daily-partitioned GPU Function on class `default`
over table `events` (five rows a day), each call holding its slot for a second so the test sees
which runs compute at once; the same Function as a single-run backfill over two workers; and one
that fails on one day's rows until the test mends it."""

import os
import time
from pathlib import Path

import dagster as dg
import pyarrow as pa

from gpufn_dagster import build_definitions, gpu_function

DAYS = dg.DailyPartitionsDefinition(start_date="2026-01-01", end_date="2026-01-21")


def held_double(id: pa.Array) -> pa.Array:  # noqa: A002 - the column's name
    time.sleep(1.0)
    return pa.compute.multiply(id, 2)


def tripled(id: pa.Array) -> pa.Array:  # noqa: A002
    return pa.compute.multiply(id, 3)


def flaky(id: pa.Array) -> pa.Array:  # noqa: A002
    """Fails on the rows of 2026-01-02 (ids 5-9) until the test creates the gate `fixed`."""
    if any(5 <= i < 10 for i in id.to_pylist()) and not (Path(os.environ["GPUFN_TEST_GATES"]) / "fixed").exists():
        raise RuntimeError("the model is broken for these rows")
    return pa.compute.add(id, 7)


daily = gpu_function(table="events", column="double", gpu_class="default", output_type=pa.int64(),
                     partitions_def=DAYS, partition_column="day")(held_double)
ranged = gpu_function(table="events", column="triple", gpu_class="default", output_type=pa.int64(),
                      partitions_def=DAYS, partition_column="day", workers=2,
                      backfill_policy=dg.BackfillPolicy.single_run())(tripled)
mended = gpu_function(table="events", column="plus_seven", gpu_class="default", output_type=pa.int64(),
                      partitions_def=DAYS, partition_column="day")(flaky)
defs = build_definitions(assets=[daily, ranged, mended])
