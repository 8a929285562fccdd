"""GPU Functions on LanceDB tables as Dagster assets."""

from .assets import function_asset, function_of, gpu_function
from .classes import GpuClass, GpuClassError, list_gpu_classes, load_gpu_classes
from .definitions import build_definitions
from .functions import Function, FunctionDefinitionError, make_function
from .refresh.engine import RefreshResult, refresh_column
from .resources import LanceDBResource, TableNotFound
from .views import materialized_view_asset

__all__ = [
    "Function", "FunctionDefinitionError", "GpuClass", "GpuClassError", "LanceDBResource", "RefreshResult", "TableNotFound",
    "build_definitions", "function_asset", "function_of", "gpu_function", "list_gpu_classes", "load_gpu_classes",
    "make_function", "materialized_view_asset", "refresh_column",
]
