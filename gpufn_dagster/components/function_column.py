"""`FunctionColumn`: a Function declared in YAML."""

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import dagster as dg

from ..assets.checks import function_checks
from ..assets.function_asset import function_asset
from ..errors import ComponentError, FunctionDefinitionError
from ..function_spec.functions import make_function
from ..function_spec.options import FunctionOptions


def import_object(path: str) -> Any:
    """The object an import path names: `package.module:name` (or `:Outer.inner`).

    >>> import_object("gpufn_dagster.function_spec.options:FunctionOptions").__name__
    'FunctionOptions'
    """
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ImportError(f"{path!r} is not of the form 'package.module:name'")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def _resolve_callable(context: dg.ResolutionContext, path: str) -> Any:
    path = context.resolve_value(path, as_type=str)
    try:
        return import_object(path)
    except (ImportError, AttributeError) as err:
        raise ComponentError(f"field 'function': cannot import {path!r}: {err}") from None


@dataclass(frozen=True, kw_only=True)
class FunctionColumn(dg.Component, FunctionOptions):
    """A Function that computes a column of a LanceDB table (the options of `gpu_function`, in YAML)."""

    function: Annotated[Any, dg.Resolver(_resolve_callable, model_field_type=str,
        description="Import path of the function, class or lancedb.udf: 'package.module:name'.")]
    checks: Annotated[bool, dg.Resolver.default(
        description="Add the two asset checks (no_unfilled_rows, failed_rows_below_threshold).")] = False

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = str(Path(context.path) / "defs.yaml")
        try:
            asset = function_asset(make_function(self.function, FunctionOptions.declared(self)), declared_in=where)
        except FunctionDefinitionError as err:
            raise ComponentError(f"{where}: {err}") from None
        asset_checks = function_checks(asset) if self.checks else []
        return dg.Definitions(assets=[asset], asset_checks=asset_checks)
