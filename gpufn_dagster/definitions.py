"""Building a code location's Definitions: validation that needs the database, and the resource.

Class problems (unknown class, too many GPUs) are caught by `gpu_function` itself; what needs the
database -- that a Function's table exists or is produced by an asset of these definitions, and
has the Function's input columns -- is checked here, so a typo fails `dagster dev` at load rather
than the first run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import dagster as dg
import lancedb

from .assets import DECLARED_IN, function_of
from .functions import FunctionDefinitionError
from .resources import LanceDBResource, default_db_uri


def check_tables(assets: Sequence[Any], db_uri: str) -> None:
    """Every Function's table exists (or an asset here produces it) and has the Function's inputs."""
    db = lancedb.connect(db_uri)
    existing = set(db.list_tables().tables)
    keys = {key for asset in assets if isinstance(asset, dg.AssetsDefinition) for key in asset.keys}
    problems = []
    for asset in assets:
        function = function_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
        if function is None:
            continue
        where = f"{DECLARED_IN[asset.key]}: " if asset.key in DECLARED_IN else ""
        if function.table not in existing:
            if dg.AssetKey(function.source_asset) not in keys:
                problems.append(f"{where}Function {function.name!r}: field 'table': table {function.table!r} does not "
                                f"exist in {db_uri} and no asset here produces it; tables: "
                                f"{', '.join(sorted(existing)) or '(none)'}")
            continue
        columns = [n for n in db.open_table(function.table).schema.names if not n.startswith("_gpufn")]
        missing = [c for c in function.inputs if c not in columns]
        if missing:
            problems.append(f"{where}Function {function.name!r}: field 'inputs': table {function.table!r} has no column "
                            f"{', '.join(map(repr, missing))}; it has {', '.join(columns)}")
    if problems:
        raise FunctionDefinitionError("\n".join(problems))


def build_definitions(
    *,
    assets: Sequence[Any],
    db_uri: str | None = None,
    schedules: Sequence[Any] = (),
    sensors: Sequence[Any] = (),
    jobs: Sequence[Any] = (),
    asset_checks: Sequence[Any] = (),
    resources: dict[str, Any] | None = None,
) -> dg.Definitions:
    """Definitions for Functions, views and ordinary assets sharing one LanceDB database."""
    uri = db_uri or default_db_uri()
    check_tables(assets, uri)
    return dg.Definitions(
        assets=list(assets),
        asset_checks=list(asset_checks),
        schedules=list(schedules),
        sensors=list(sensors),
        jobs=list(jobs),
        resources={"lancedb": LanceDBResource(uri=uri), **(resources or {})},
    )
