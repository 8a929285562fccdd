"""The embedded wing: the default mode `dagster dev` serves on a workstation -- runs in local
processes, GPU steps on local slots, Function instances kept warm between steps.

Holds `coordinator` (GpuQueuedRunCoordinator: pool limits per class, waits said on the run page),
`launcher` (GpuLocalRunLauncher: each code location's next run worker started ahead),
`warm_worker` (that worker's process), `forkserver` and `step_preload` (the steps' forkserver and
what it preloads), `slots` (which local slot and device a GPU step holds), `warm` and `warm_host`
(warm Function instances and the process holding each: the engine's `InstanceSource` seam
implemented) and `procfs` (processes read from /proc). Every process this mode starts or watches is
owned here; the engine owns none.

May import: run, refresh, function_spec, top-level modules.
Never imports: run.k8s, assets, components, kubernetes, dagster_k8s.
"""
