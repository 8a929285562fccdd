"""GPU Functions on LanceDB tables as Dagster assets.

The names below are imported on first use, so `gpufn --help` and a class listing do not pay for
Dagster, LanceDB and the refresh engine.
"""

from __future__ import annotations

import importlib
from typing import Any

# Public name -> the module that defines it.
_EXPORTS = {
    "Function": "functions", "FunctionDefinitionError": "errors", "FunctionOptions": "options",
    "GpuClass": "classes", "GpuClassError": "errors", "GpufnError": "errors", "LanceDBResource": "resources",
    "ColumnRefresh": "refresh.engine", "RefreshOptions": "refresh.engine", "RefreshResult": "refresh.results", "TableNotFound": "errors", "build_definitions": "definitions",
    "function_asset": "assets", "function_of": "asset_spec", "gpu_function": "assets", "list_gpu_classes": "classes",
    "load_gpu_classes": "classes", "make_function": "functions", "materialized_view_asset": "views",
    "refresh_column": "refresh.engine", "gpu_classes_executor": "run.executor",
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
