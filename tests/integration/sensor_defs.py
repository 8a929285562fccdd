"""A code location with a table sensor, for the sensor daemon test (database from $GPUFN_LANCEDB_URI)."""

from gpufn_dagster import build_definitions, gpu_function
from gpufn_dagster.assets.triggers import table_sensor


def upper(text: str) -> str:
    return text.upper()


up = gpu_function(table="docs", column="up", gpu_class="l4")(upper)
defs = build_definitions(assets=[up], sensors=[table_sensor("docs", [up], running=True, minimum_interval_seconds=0)])
