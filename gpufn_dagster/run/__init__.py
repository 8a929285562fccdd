"""The run half: where a run goes and how it waits for GPUs.

From the bottom up: `placement` and `capacity` decide (pure: class x count -> pod configuration;
pod status -> verdict -> what to record); `shared` reads a run (its steps' GPU requests, whether
it uses step pods) into one `RunPlan`; above it stand the two paths, which never import each
other: `local` (the embedded default's per-class slots) and the Kubernetes path -- `k8s_api`
(the one boundary every Kubernetes call goes through), `launcher` (GpuK8sRunLauncher) and
`watch` (the capacity watcher and its sensor).
"""
