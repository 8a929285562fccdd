"""The run core: where a run goes and how it waits for GPUs, decided without process or Kubernetes I/O.

Holds what both modes share: `placement` and `capacity` decide (pure: class x count -> pod
configuration; pod status -> verdict -> what to record) and `local_capacity` (the same for local
slots: a run's slot waits -> what to record), `kueue` (Kueue's objects
and Workload states, pure), `claims` (a DRA class's claim templates, pure), `estimate` and `history` (how long a wait lasts, from the instance's
history), `pools` (who waits behind whom for local slots, pure), `gauges` (per-class gauges),
`write_budget` (how long a waiting path's pass writes; the rest waits for the next), `kept_runs`
(the runs a waiting path judges, kept between its passes) and
`run_plan` (a run's steps' GPU requests read into one `RunPlan`). The two modes stand above it as
wings that never import each other: `run.k8s` (Kubernetes) and `gpufn_dagster.embedded` (the
embedded default `dagster dev` serves).

May import: top-level modules.
Never imports: run.k8s, embedded, refresh, assets, components, kubernetes, dagster_k8s.
"""
