"""LanceDB materialized views as Dagster assets: materializing one refreshes it incrementally.

lancedb keeps the view's provenance (`__source_row_id`, the last source version) and refreshes
only what changed when it can reconcile the source's changes, rebuilding otherwise. Function
columns on a view are ordinary Function assets whose `source_asset` is the view, so the graph
refreshes the view first and its Functions after; a rebuild keeps their values (see
`refresh.carry`), so they too recompute only rows that are new or changed.
"""


import time
from collections.abc import Sequence
from typing import Any

import dagster as dg

from ..refresh.carry import carry_over
from ..tags import SOURCE_VERSION_KEY
from ..function_spec.asset_attributes import AssetAttributes
from ..function_spec.options import AssetOptions
from .asset_spec import with_freshness
from .resources import LanceDBResource, TableNotFound


def materialized_view_asset(
    name: str,
    *,
    source: str,
    select: Sequence[str] | dict[str, str] | None = None,
    where: str | None = None,
    source_asset: str | None = None,
    **attributes: Any,
) -> dg.AssetsDefinition:
    """An asset owning the view `name` over table `source` (which needs stable row ids).

    Materializing it creates the view the first time (lancedb's `create_materialized_view`) and
    refreshes it after that; a Function on the view is a `gpu_function` whose `source_asset` is it.

    Args:
        name: the view's name, a table of the same database.
        source: the source table.
        select: the source columns to keep (or a mapping of output name to SQL expression); all by default.
        where: a SQL filter on source rows, e.g. "lang = 'en'".
        source_asset: the asset producing the source (default: `source`).
        attributes: what any Dagster asset takes (`function_spec.options.AssetOptions`): group_name,
            description, key_prefix, owners, tags, metadata, kinds, automation_condition,
            freshness_policy, legacy_freshness_policy. The dependency (on `source_asset`) is the view's own.

    Example:
        >>> docs_en = materialized_view_asset("docs_en", source="docs", select=["id", "text"], where="lang = 'en'")
        >>> docs_en.key.to_user_string(), [d.asset_key.to_user_string() for d in docs_en.specs_by_key[docs_en.key].deps]
        ('docs_en', ['docs'])
        >>> materialized_view_asset("docs_en", source="docs", owners=["team:search"]).owners_by_key[docs_en.key]
        ['team:search']
    """
    label = f"view {name!r}"
    options = AssetOptions.of(attributes, label)
    declared = AssetAttributes.of(options, label)
    merged = declared.merged(label, {}, {"source_table": source, "where": where or "", "select": str(select or "*")},
                             {"lance", "view"})

    @dg.asset(
        key=[*declared.key_prefix, name],
        deps=[dg.AssetKey.from_user_string(source_asset or source)],
        group_name=options.group_name,
        description=options.description or f"Materialized view of {source}" + (f" where {where}" if where else ""),
        **merged,
    )
    def _view(context: dg.AssetExecutionContext, lancedb: LanceDBResource) -> dg.MaterializeResult:
        db = lancedb.connect()
        if source not in lancedb.table_names(db):
            raise TableNotFound(f"view {name!r}: source table {source!r} does not exist in {lancedb.uri}")
        started = time.monotonic()
        created: int | None = None  # rows lancedb wrote when it created the view (its first build)
        if name in db.list_materialized_views():
            view = db.open_materialized_view(name)
        else:
            context.log.info(f"creating materialized view {name!r} over {source!r}")
            view = db.create_materialized_view(name, source, select=select, where=where)
            created = db.open_table(name).count_rows()
        version_before = db.open_table(name).version
        result = view.refresh()
        carried = carry_over(lancedb.table_files(name), version_before) if str(result.mode) == "rebuild" else 0
        wall = time.monotonic() - started
        rows_written = (created or 0) + result.rows_written
        if created is not None:
            what = f"created with {created:,} rows" + (
                f", then a {result.mode} refresh wrote {result.rows_written:,}" if result.rows_written else "")
        else:
            what = f"{result.mode} refresh wrote {rows_written:,} rows"
        context.log.info(f"view {name!r}: {what} from source version {result.source_version} in {wall:.2f}s"
                         + (f"; kept the Function values of {carried:,} rows" if carried else ""))
        return dg.MaterializeResult(metadata={
            "refresh_mode": "create" if created is not None else str(result.mode),
            "rows_written": rows_written,
            SOURCE_VERSION_KEY: result.source_version,
            "view_version": result.version,
            "function_rows_kept": carried,
            "wall_seconds": dg.FloatMetadataValue(round(wall, 3)),
            "dagster/row_count": db.open_table(name).count_rows(),
        })

    return with_freshness(_view, declared)
