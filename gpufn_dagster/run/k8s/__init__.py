"""The Kubernetes wing: runs as pods on the GPU classes' node pools, and their waits for room.

Holds `client` (the one boundary every Kubernetes API call goes through, retries and typed errors),
`pods` (a placement decided at launch, applied to a run pod or a GPU step pod), `launcher`
(GpuK8sRunLauncher: one decision per run, made at launch), `watch` (the capacity watcher and its
`capacity_sensor`: it decides through the core's pure `capacity` and only applies tags and events)
and `informers` (the sensor's lists of pods, Jobs, events and nodes, kept current by watches).
A later Kubernetes home for warm Function instances belongs here, beside the embedded wing's.

May import: run, top-level modules.
Never imports: embedded, refresh, assets, components.
"""
