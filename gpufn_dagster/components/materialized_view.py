"""`MaterializedView`: a LanceDB materialized view declared in YAML."""

import dataclasses
from dataclasses import dataclass
from typing import Annotated

import dagster as dg

from ..assets.views import materialized_view_asset
from ..function_spec.options import AssetOptions, described


@dataclass(frozen=True, kw_only=True)
class MaterializedView(dg.Component, AssetOptions):
    """A LanceDB materialized view over a source table (see `materialized_view_asset`), with every
    attribute a Dagster asset takes (`AssetOptions`)."""

    name: Annotated[str, described("The view's name (a table of the same database).")]
    source: Annotated[str, described("The source table; it needs stable row ids.")]
    select: Annotated[list[str] | None, described("The source columns the view keeps (default: all).")] = None
    where: Annotated[str | None, described("A SQL filter on source rows, e.g. \"lang = 'en'\".")] = None
    source_asset: Annotated[str | None, described("The asset producing the source (default: source).")] = None

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        attributes = {f.name: getattr(self, f.name) for f in dataclasses.fields(AssetOptions)}
        return dg.Definitions(assets=[materialized_view_asset(
            self.name, source=self.source, select=self.select, where=self.where, source_asset=self.source_asset,
            **attributes)])
