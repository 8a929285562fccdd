"""The Dagster layer: a Function as an asset (one worker, or plan -> shards -> commit), the
LanceDB resource every step opens, what a materialization reports, materialized views,
schedules, sensors and checks, `build_definitions`, which puts them together, and its executor
(`executor`: steps in the run worker's processes, or in pods of their own when a Kubernetes run
mixes classes), which is why this layer, alone, stands above both wings.

May import: run, run.k8s, embedded, refresh, function_spec, top-level modules.
Never imports: components.
"""
