"""A code location for the freshness test: a CPU Function on table `docs` with Dagster's freshness
policy (fresh for an hour after each materialization)."""

import datetime

import dagster as dg

from gpufn_dagster import build_definitions, gpu_function


@gpu_function(table="docs", column="loud",
              freshness_policy=dg.FreshnessPolicy.time_window(fail_window=datetime.timedelta(hours=1)))
def loud(text: str) -> str:
    return text.upper()


defs = build_definitions(assets=[loud])
