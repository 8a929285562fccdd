"""GPU Functions on LanceDB tables as Dagster assets."""

from .assets import function_asset, function_of, gpu_function
from .classes import GpuClass, list_gpu_classes, load_gpu_classes
from .definitions import build_definitions
from .errors import FunctionDefinitionError, GpuClassError, GpufnError, TableNotFound
from .functions import Function, make_function
from .options import FunctionOptions
from .refresh.engine import RefreshResult, refresh_column
from .resources import LanceDBResource
from .views import materialized_view_asset

__all__ = [
    "Function", "FunctionDefinitionError", "FunctionOptions", "GpuClass", "GpuClassError", "GpufnError",
    "LanceDBResource", "RefreshResult", "TableNotFound", "build_definitions", "function_asset", "function_of",
    "gpu_function", "list_gpu_classes", "load_gpu_classes", "make_function", "materialized_view_asset",
    "refresh_column",
]
