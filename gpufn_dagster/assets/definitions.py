"""Building a code location's Definitions: chained Functions, validation that needs the database,
and the resource.

Class problems (unknown class, too many GPUs) are caught by `gpu_function` itself; what needs the
database -- that a Function's table exists or is produced by an asset of these definitions, and
has the Function's input columns of a type that can be signed -- is checked here, so a typo fails
`dagster dev` at load rather than the first run.

A Function reading another Function's output column (same table) depends on that Function's
asset: the lineage graph shows it, Materialize all runs them in order, and the column need not
exist before either has run.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dagster as dg

from ..class_files import cached_gpu_classes
from ..errors import FunctionDefinitionError, GpuClassError
from ..refresh.columns import is_function_column
from ..refresh.signature import unsupported_reason
from .executor import gpu_classes_executor
from ..run.gauges import CAPACITY_SENSOR, capacity_specs
from ..function_spec.functions import Function
from .asset_spec import declared_in, function_of
from .function_asset import function_asset
from .resources import LanceDBResource, default_db_uri
from .table_partitions import observes_rows, rows_asset_key, table_rows_assets
from .table_schemas import confirmed, table_schemas


def _functions(assets: Sequence[Any]) -> dict[dg.AssetKey, Function]:
    return {asset.key: f for asset in assets
            if isinstance(asset, dg.AssetsDefinition) and (f := function_of(asset)) is not None}


def upstream_functions(function: Function, functions: Sequence[Function]) -> list[Function]:
    """The other Functions whose output columns this Function reads (on the same table).

    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> def embed(text: str) -> float: return 0.0
    >>> def score(embedding: float) -> float: return embedding
    >>> a = make_function(embed, table="docs", column="embedding")
    >>> b = make_function(score, table="docs", column="score")
    >>> [f.name for f in upstream_functions(b, [a, b])], upstream_functions(a, [a, b])
    (['docs__embedding'], [])
    """
    return [other for other in functions if other is not function and other.table == function.table
            and set(other.columns) & set(function.inputs)]


def chain_functions(assets: Sequence[Any]) -> list[Any]:
    """The assets, each Function asset depending also on the Function assets whose columns it reads,
    and an unpartitioned Function with an automation condition on its table's observed rows
    (`table_partitions.rows_asset_key`).

    The Functions it reads are recorded on it too (`assets.reads`): its refresh refuses to start
    while one of their columns is not current, however it is materialized.
    """
    functions = _functions(assets)
    out = []
    for asset in assets:
        function = function_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
        upstream = upstream_functions(function, list(functions.values())) if function else []
        keys = [key for key, other in functions.items() if any(other is u for u in upstream)]
        observed = [rows_asset_key(function)] if function is not None and observes_rows(function) else []
        if keys or observed:  # made again with them: a dependency added to a made asset
            # (`map_asset_specs`) shows in the asset graph but never orders the steps of a run (Dagster
            # 1.13 gives the op the input and not its asset key), so a Function ran beside the one it reads
            asset = function_asset(function, declared_in=declared_in(asset),
                                   upstream={k: functions[k] for k in keys}, observed=observed)
        out.append(asset)
    return out


def with_table_uri(asset: Any, db_uri: str) -> Any:
    """A Function asset with the URI of its table (`table_uri`) on its page; other assets as they are."""
    function = function_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
    if function is None:
        return asset
    uri = f"{db_uri.rstrip('/')}/{function.table}.lance"
    return asset.map_asset_specs(lambda spec: spec.replace_attributes(metadata={**spec.metadata, "table_uri": uri}))


def check_tables(assets: Sequence[Any], lancedb: LanceDBResource, schemas_state: Path | None = None) -> None:
    """Every Function's table exists (or an asset here produces it) and has the Function's inputs
    (or another Function here computes them), each of a type that can be an input.

    The schemas come from `table_schemas`: read once per table where the code location is defined
    (or from its `schemas_state` file, opening no table), and in a run worker or step process from
    what that load kept, without opening the database. Problems found in a state file's snapshot are
    confirmed on the tables themselves before the load fails."""
    functions = list(_functions(assets).values())
    tables = {function.table for function in functions}
    schemas, from_state = table_schemas(lancedb, tables, schemas_state)
    problems = table_problems(assets, schemas, lancedb)
    if problems and from_state:
        problems = table_problems(assets, confirmed(lancedb, tables), lancedb)
        if problems:  # the tables say so too: the snapshot is not the cause, but say it was used
            problems.append(f"(the schemas state file {schemas_state} showed this, and reading the tables of "
                            f"{lancedb.uri} confirmed it)")
        else:  # the snapshot is older than the tables: this load read them; the next ones will too
            warnings.warn(f"{schemas_state}: the schemas state is older than the tables of {lancedb.uri} (a Function "
                          "reads a column or table it lacks), so this load read the tables; run `gpufn "
                          "refresh-state` to write it again", stacklevel=2)
    if problems:
        raise FunctionDefinitionError("\n".join(problems))


def table_problems(assets: Sequence[Any], schemas: dict[str, Any], lancedb: LanceDBResource) -> list[str]:
    """What `check_tables` finds wrong with the Functions among `assets`, judged on `schemas` (each
    Function's table's, None for a table that does not exist), one line each naming the Function and
    the field."""
    keys = {key for asset in assets if isinstance(asset, dg.AssetsDefinition) for key in asset.keys}
    functions = list(_functions(assets).values())
    problems = []
    for asset in assets:
        function = function_of(asset) if isinstance(asset, dg.AssetsDefinition) else None
        if function is None:
            continue
        where = f"{declared_in(asset)}: " if declared_in(asset) else ""
        schema = schemas[function.table]
        if schema is None:
            if function.source_key not in keys:
                problems.append(f"{where}Function {function.name!r}: field 'table': table {function.table!r} does not "
                                f"exist in {lancedb.uri} and no asset here produces it; tables: "
                                f"{', '.join(sorted(lancedb.table_names())) or '(none)'}")
            continue
        columns = [n for n in schema.names if not n.startswith("_gpufn")]
        computed = {c for u in upstream_functions(function, functions) for c in u.columns}
        missing = [c for c in function.inputs if c not in columns and c not in computed]
        if missing:
            problems.append(f"{where}Function {function.name!r}: field 'inputs': table {function.table!r} has no column "
                            f"{', '.join(map(repr, missing))}; it has {', '.join(columns)}")
        taken = [c for c in (*function.columns, function.sig_column)
                 if c in schema.names and not is_function_column(schema.field(c))]
        if taken:
            problems.append(f"{where}Function {function.name!r}: field 'column': {', '.join(map(repr, taken))} of "
                            f"table {function.table!r} holds the table's own data, which the Function would "
                            "overwrite; choose another column name")
        if function.partitioning is not None:
            problems.extend(where + p for p in function.partitioning.problems(f"Function {function.name!r}", schema))
        for name in function.inputs:
            if name in columns and (reason := unsupported_reason(schema.field(name).type)):
                problems.append(f"{where}Function {function.name!r}: field 'inputs': column {name!r} of table "
                                f"{function.table!r} has type {schema.field(name).type}, which cannot be an input "
                                f"({reason})")
    return problems


def _capacity_assets(sensors: Sequence[Any]) -> list[dg.AssetSpec]:
    """With the gpu_capacity sensor, one asset per GPU class for its ticks' observations (none when
    the class files do not load: the sensor's ticks say why)."""
    if not any(getattr(sensor, "name", None) == CAPACITY_SENSOR for sensor in sensors):
        return []
    try:
        return capacity_specs(cached_gpu_classes())
    except GpuClassError:
        return []


def build_definitions(
    *,
    assets: Sequence[Any],
    db_uri: str | None = None,
    storage_options: dict[str, str] | None = None,
    schedules: Sequence[Any] = (),
    sensors: Sequence[Any] = (),
    jobs: Sequence[Any] = (),
    asset_checks: Sequence[Any] = (),
    resources: dict[str, Any] | None = None,
    executor: Any = None,
    schemas_state: str | Path | None = None,
) -> dg.Definitions:
    """Definitions for Functions, views and ordinary assets sharing one LanceDB database.

    Each Function reading another's column is chained after it (`chain_functions`), every table is
    checked against its Functions (`check_tables`), and partitioned Functions get their table's
    rows per partition, Functions with an automation condition their table's rows, as observed
    assets (`table_partitions`), unless `assets` defines them. With
    the `gpu_capacity` sensor among `sensors`, each GPU class gets an external asset,
    `gpu_capacity/<class>`, whose observations are the sensor ticks' gauges.

    Args:
        assets: Function assets (`gpu_function`, `function_asset`), views and any other assets.
        db_uri: the LanceDB database (default `$GPUFN_LANCEDB_URI`, else `.gpufn_data/lancedb` under the
            current directory): a local path or `s3://bucket/folder`.
        storage_options: how to reach the object store (see `LanceDBResource`).
        schedules, sensors, jobs, asset_checks: passed to `dagster.Definitions` as they are.
        resources: more resources; `lancedb` is added.
        executor: the executor of the definitions' jobs (default `gpu_classes_executor`: each step
            in a process of the run worker, as Dagster's default does, except that on Kubernetes a
            run mixing GPU classes or fanning a refresh out runs each step in its own pod, placed on
            its class at launch). Pass `dagster.multiprocess_executor` for never (a run mixing
            classes is then refused on Kubernetes). Not `dagster_k8s.k8s_job_executor`: its step pods
            would carry no class, so the GPU launcher refuses a GPU run on it.
        schemas_state: a file holding the tables' schemas, which `gpufn refresh-state` writes: where
            it exists (for this `db_uri`), loading the definitions opens no table (a code server
            starts without a round trip to the object store); a problem it shows is confirmed on the
            tables before the load fails. Without it the code server reads each table once.

    Example:
        >>> import tempfile, lancedb, pyarrow as pa
        >>> from gpufn_dagster import gpu_function
        >>> db_uri = tempfile.mkdtemp()
        >>> _ = lancedb.connect(db_uri).create_table("docs", pa.table({"text": ["a b"]}))
        >>> def upper(text: str) -> str: return text.upper()
        >>> defs = build_definitions(assets=[gpu_function(table="docs", column="loud")(upper)], db_uri=db_uri)
        >>> sorted(key.to_user_string() for key in defs.resolve_asset_graph().get_all_asset_keys())
        ['docs', 'docs__loud']
    """
    database = LanceDBResource(uri=db_uri or default_db_uri(), storage_options=dict(storage_options or {}))
    check_tables(assets, database, Path(schemas_state) if schemas_state is not None else None)
    defined = {key for asset in assets for key in (asset.keys if isinstance(asset, dg.AssetsDefinition)
                                                   else [getattr(asset, "key", None)])}
    rows = table_rows_assets(_functions(assets).values(), defined)
    capacity = [spec for spec in _capacity_assets(sensors) if spec.key not in defined]
    return dg.Definitions(
        assets=[*(with_table_uri(asset, database.uri) for asset in chain_functions(assets)), *rows, *capacity],
        asset_checks=list(asset_checks),
        schedules=list(schedules),
        sensors=list(sensors),
        jobs=list(jobs),
        resources={"lancedb": database, **(resources or {})},
        executor=executor if executor is not None else gpu_classes_executor,
    )
