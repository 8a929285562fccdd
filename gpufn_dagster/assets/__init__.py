"""The Dagster layer: a Function as an asset (one worker, or plan -> shards -> commit), the
LanceDB resource every step opens, what a materialization reports, materialized views,
schedules, sensors and checks, and `build_definitions`, which puts them together."""
