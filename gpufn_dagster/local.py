"""`module: gpufn_dagster.local` in dagster.yaml: the embedded mode's local GPU slots (see `run.local`)."""

from .run.local import GpuQueuedRunCoordinator

__all__ = ["GpuQueuedRunCoordinator"]
