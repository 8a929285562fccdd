"""`module: gpufn_dagster.launcher` in dagster.yaml: the Kubernetes GPU run launcher (see `run.launcher`)."""

from .run.launcher import GpuK8sRunLauncher

__all__ = ["GpuK8sRunLauncher"]
