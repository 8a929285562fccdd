"""GPU Functions on LanceDB tables as Dagster assets.

The names below are imported on first use, so `gpufn --help` and a class listing do not pay for
Dagster, LanceDB and the refresh engine. The instance's run launcher and run coordinator are named
here too, as `dagster.yaml` names them:

    run_launcher:
      module: gpufn_dagster
      class: GpuK8sRunLauncher
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS = {
    "ColumnRefresh": "refresh.engine", "ErrorPolicy": "function_spec.error_policy", "Fail": "function_spec.error_policy",
    "FailureBudgetExceeded": "errors", "Function": "function_spec.functions", "FunctionDefinitionError": "errors",
    "FunctionOptions": "function_spec.options", "GpuClass": "classes", "GpuClassError": "errors",
    "GpuK8sRunLauncher": "run.k8s.launcher", "GpuLocalRunLauncher": "embedded.launcher", "GpuQueuedRunCoordinator": "embedded.coordinator",
    "GpufnError": "errors",
    "LanceDBResource": "assets.resources", "RefreshOptions": "refresh.engine", "RefreshResult": "refresh.results",
    "Retry": "function_spec.error_policy", "RowTimeout": "errors", "Skip": "function_spec.error_policy",
    "TableNotFound": "errors", "build_definitions": "assets.definitions", "capacity_sensor": "run.k8s.watch", "function_asset": "assets.function_asset",
    "function_of": "assets.asset_spec", "gpu_classes_executor": "assets.executor", "gpu_function": "assets.function_asset",
    "list_gpu_classes": "class_files", "load_gpu_classes": "class_files", "make_function": "function_spec.functions",
    "materialized_view_asset": "assets.views", "refresh_column": "refresh.engine",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
    globals()[name] = value  # the next lookup is a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
