"""Declaring Functions and materialized views in YAML, as Dagster Components.

    # defs/word_count/defs.yaml
    type: gpufn_dagster.components.FunctionColumn
    attributes:
      table: docs
      column: word_count
      function: my_project.udfs:count_words     # import path of the callable, class or lancedb.udf
      gpu_class: l4                              # omit for a CPU Function (or gpu: true for `default`)

The component builds exactly the asset `gpu_function` builds from the same arguments, so YAML and
Python declarations are interchangeable. Unknown fields are rejected by Dagster's schema check
with the file and line; a bad import path, an unknown class, too many GPUs or a bad output type
are reported with the file and the field.
"""

import importlib
from pathlib import Path
from typing import Any, Literal

import dagster as dg

from .assets import DECLARED_IN, gpu_function
from .checks import function_checks
from .functions import FunctionDefinitionError, parse_arrow_type
from .views import materialized_view_asset


class ComponentError(ValueError):
    """A YAML component's attribute is invalid; the message names the file and the field."""


def import_object(path: str) -> Any:
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not of the form 'package.module:name'")
    value: Any = importlib.import_module(module_name)
    for part in attribute.split("."):
        value = getattr(value, part)
    return value


def _where(context: dg.ComponentLoadContext) -> str:
    return str(Path(context.path) / "defs.yaml")


class FunctionColumn(dg.Component, dg.Model, dg.Resolvable):
    """A Function that computes a column of a LanceDB table (see `gpu_function`)."""

    table: str
    column: str | list[str]
    function: str
    output_type: str | None = None
    inputs: list[str] | None = None
    gpu: bool | None = None
    gpu_class: str | None = None
    gpu_count: int = 1
    batch_size: int = 1024
    on_error: Literal["fail", "skip"] = "fail"
    init: dict[str, Any] | None = None
    name: str | None = None
    source_asset: str | None = None
    group_name: str | None = None
    description: str | None = None
    version: str | None = None
    checkpoint_seconds: float = 10.0
    checks: bool = False
    max_failed_fraction: float = 0.0

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        where = _where(context)
        try:
            target = import_object(self.function)
        except (ImportError, AttributeError, ValueError) as err:
            raise ComponentError(f"{where}: field 'function': cannot import {self.function!r}: {err}") from None
        try:
            output_type = parse_arrow_type(self.output_type) if self.output_type else None
        except (ValueError, KeyError) as err:
            raise ComponentError(f"{where}: field 'output_type': {self.output_type!r} is not an Arrow type: {err}") from None
        try:
            asset = gpu_function(
                table=self.table, column=self.column, output_type=output_type, inputs=self.inputs, gpu=self.gpu,
                gpu_class=self.gpu_class, gpu_count=self.gpu_count, batch_size=self.batch_size,
                on_error=self.on_error, init=self.init, name=self.name, source_asset=self.source_asset,
                group_name=self.group_name, description=self.description, version=self.version,
                checkpoint_seconds=self.checkpoint_seconds,
            )(target)
        except FunctionDefinitionError as err:
            raise ComponentError(f"{where}: {err}") from None
        DECLARED_IN[asset.key] = where
        checks = function_checks(asset, max_failed_fraction=self.max_failed_fraction) if self.checks else []
        return dg.Definitions(assets=[asset], asset_checks=checks)


class MaterializedView(dg.Component, dg.Model, dg.Resolvable):
    """A LanceDB materialized view over a source table (see `materialized_view_asset`)."""

    name: str
    source: str
    select: list[str] | None = None
    where: str | None = None
    source_asset: str | None = None
    group_name: str | None = None
    description: str | None = None

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return dg.Definitions(assets=[materialized_view_asset(
            self.name, source=self.source, select=self.select, where=self.where, source_asset=self.source_asset,
            group_name=self.group_name, description=self.description)])
