"""A Function's options, declared once: the Python decorator, the spec builder and the YAML component
all take exactly these fields, with these defaults and descriptions.

`gpu_function(**options)` and `make_function(target, **options)` build a `FunctionOptions` from
their keywords (an unknown one is refused, listing the valid ones); the YAML component
`FunctionColumn` *is* a `FunctionOptions` plus the import path of its callable, so Dagster
Components validates and documents the same fields (`dg list component-tree`, editor schemas)
from the same descriptions.
"""

import dataclasses
import inspect
import typing
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Self

import dagster as dg
from dagster.components.resolved import core_models as asset_models

from ..errors import ComponentError, FunctionDefinitionError
from .code_version import signature
from .arrow_types import parse_arrow_type

# Dagster's own YAML forms of partitions and backfill policies (`type: daily`, `type: static`,
# `type: single_run`), so a Function's YAML reads like any asset's.
_PARTITIONS_YAML = (asset_models.HourlyPartitionsDefinitionModel | asset_models.DailyPartitionsDefinitionModel
                    | asset_models.WeeklyPartitionsDefinitionModel | asset_models.TimeWindowPartitionsDefinitionModel
                    | asset_models.StaticPartitionsDefinitionModel)
_BACKFILL_YAML = asset_models.SingleRunBackfillPolicyModel | asset_models.MultiRunBackfillPolicyModel


class ErrorRuleModel(dg.Model):
    """One on_error rule as YAML writes it (the fields of `error_policy.ErrorRule`)."""

    action: Literal["retry", "skip", "fail"]
    errors: list[str] | None = None
    match: str | None = None
    attempts: int | None = None
    backoff_seconds: float | None = None
    max_backoff_seconds: float | None = None
    then: Literal["skip", "fail"] | None = None


def _error_policy(context: dg.ResolutionContext, value: Any) -> Any:
    """YAML's on_error: the shorthand as it is, rules as mappings (checked with the Function)."""
    if isinstance(value, list):
        return [rule.model_dump(exclude_none=True) if isinstance(rule, dg.Model) else rule for rule in value]
    return context.resolve_value(value)


def _arrow_type(context: dg.ResolutionContext, value: str | None) -> Any:
    """YAML's type name as a pyarrow type (Dagster adds the file, line and a caret to the error)."""
    if value is None:
        return None
    try:
        return parse_arrow_type(context.resolve_value(value, as_type=str))
    except ValueError as err:
        raise ComponentError(f"field 'output_type': {err}") from None


def described(description: str) -> dg.Resolver:
    """A YAML field's default resolver with its description (what `dg` and the docs show for it)."""
    return dg.Resolver.default(description=description)


# The asset attributes a Function owns, and why a declaration cannot set them.
OWNED_ATTRIBUTES = {
    "deps": "a Function's upstream assets are its source table's asset (source_asset=) and the Functions whose "
            "columns it reads (build_definitions finds them); give source_asset, or read the other column",
    "code_version": "a Function's code version is its Function version (a digest of its code, inputs and output "
                    "type); pin it with version=",
}


@dataclass(frozen=True, kw_only=True)
class AssetOptions(dg.Resolvable):
    """What any Dagster asset takes that gpufn passes through untouched (`asset_attributes`): the
    attributes of a Function's asset and of a materialized view's, declared once for both."""

    group_name: Annotated[str | None, described("The asset group.")] = None
    description: Annotated[str | None, described(
        "The asset's description (default: the callable's docstring, or what a view selects).")] = None
    key_prefix: Annotated[str | list[str] | None, described(
        "A prefix of the asset's key ([*key_prefix, name]), as dagster-dbt's translator gives one: two code "
        "locations can then hold Functions of the same table and column under keys of their own.")] = None
    owners: Annotated[list[str] | None, described(
        "The asset's owners (an email, or 'team:name'), as any Dagster asset takes them.")] = None
    tags: Annotated[dict[str, str] | None, described(
        "The asset's tags, beside gpufn's own (gpufn/gpu-class, gpufn/gpu-count), which they cannot replace.")] = None
    metadata: Annotated[dict[str, Any] | None, described(
        "The asset's metadata, beside what gpufn shows about the Function (whose keys it cannot replace).")] = None
    kinds: Annotated[list[str] | None, described("Kinds shown on the asset, added to gpufn's (lance, gpu or cpu).")
                     ] = None
    automation_condition: Annotated[Any, dg.Resolver.default(model_field_type=str | None, description=(
        "Dagster's declarative automation (AutomationCondition.eager(), on_cron(...), any_deps_updated()): "
        "Dagster's automation sensor requests the refresh when it holds; new rows in the source table count as "
        "an update of it (gpufn observes the table, its data version the last table version that changed rows). "
        "In YAML a template: \"{{ automation_condition.eager() }}\"."))] = None
    freshness_policy: Annotated[Any, dg.Resolver.default(model_field_type=str | None, description=(
        "Dagster's freshness policy of the asset (FreshnessPolicy.time_window(fail_window=...)): its page says "
        "whether the column is fresh."))] = None
    legacy_freshness_policy: Annotated[Any, dg.Resolver.default(model_field_type=str | None, description=(
        "Dagster's legacy freshness policy (LegacyFreshnessPolicy(maximum_lag_minutes=...)).")
                                                           )] = None

    @classmethod
    def of(cls, options: dict[str, Any], label: str = "Function") -> Self:
        """The options from keyword arguments, refusing unknown ones by name.

        >>> FunctionOptions.of({"table": "docs", "column": "n", "gpu_clas": "l4"}, "Function 'n'")
        Traceback (most recent call last):
        ...
        gpufn_dagster.errors.FunctionDefinitionError: Function 'n': unknown option 'gpu_clas'; options: table, ...
        """
        owned = sorted(set(options) & set(OWNED_ATTRIBUTES))
        if owned:
            raise FunctionDefinitionError(f"{label}: option {owned[0]!r}: {OWNED_ATTRIBUTES[owned[0]]}")
        names = [f.name for f in ordered_fields(cls)]
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise FunctionDefinitionError(f"{label}: unknown option {', '.join(map(repr, unknown))}; options: "
                                          f"{', '.join(names)}")
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.default is dataclasses.MISSING and f.name not in options]
        if missing:
            raise FunctionDefinitionError(f"{label}: missing option {', '.join(map(repr, missing))}")
        return cls(**options)


@dataclass(frozen=True, kw_only=True)
class FunctionOptions(AssetOptions):
    """Everything a Function declaration says besides its callable."""

    @classmethod
    def declared(cls, declaration: "FunctionOptions") -> "FunctionOptions":
        """The options of a declaration that is more than its options (the YAML component, which is a
        `FunctionOptions` plus its callable's path), field for field, as Dagster resolved them."""
        return cls(**{f.name: getattr(declaration, f.name) for f in dataclasses.fields(cls)})

    table: Annotated[str, described("The LanceDB table whose column(s) the Function computes.")]
    column: Annotated[str | list[str], described(
        "The output column, or several columns filled from the fields of a struct output.")]
    output_type: Annotated[Any, dg.Resolver(_arrow_type, model_field_type=str | None, description=(
        "The Arrow type of one value: a pyarrow type, or its name ('int64', 'list<float32>', "
        "'fixed_size_list<float32>[384]'); inferred from a row Function's return annotation."))] = None
    inputs: Annotated[list[str] | None, described(
        "The input columns (default: the callable's parameter names; required for one RecordBatch parameter).")] = None
    gpu: Annotated[bool | None, described(
        "Whether it is a GPU Function (default: yes when it names a gpu_class or its lancedb.udf says gpu=True).")] = None
    gpu_class: Annotated[str | list[str] | None, described(
        "The GPU class it runs on, or the classes it accepts in order of preference (['h100-80gb', "
        "'a100-80gb']: the first with room; never a CPU). Default: 'default' for a GPU Function; none makes "
        "it a CPU Function.")] = None
    gpu_count: Annotated[int, described("GPUs per worker, at most each class's max_gpu_count_per_worker.")] = 1
    batch_size: Annotated[int | None, described(
        "The most rows one call takes (what the model, device or API accepts): calls start with a small probe "
        "(64 rows, or batch_size when smaller) so first values and errors show within seconds, then adapt "
        "toward 1 s each, never above batch_size. Unset: probe 64 rows, grow up to max_batch_size.")] = None
    max_batch_size: Annotated[int | None, described(
        "Grow past batch_size: with it, batch_size is only the first call's rows and calls adapt up to this "
        "(default 4096 when batch_size is unset).")] = None
    adapt_batch_size: Annotated[bool, described(
        "Whether calls adapt; false pins every call at batch_size (still split when out of device memory).")] = True
    on_error: Annotated[Any, dg.Resolver(_error_policy, model_field_type=Literal["fail", "skip"] | list[ErrorRuleModel],
                                         description=(
        "'fail' stops the refresh at the first failing row; 'skip' leaves that row NULL, records it in the "
        "gpufn_errors table and retries it on the next refresh; or a list of rules, the first matching one "
        "deciding: retry (errors: exception class names, match: a regex on the message, attempts, backoff_seconds, "
        "then: skip|fail), skip or fail; an error no rule matches fails."))] = "fail"
    row_timeout_seconds: Annotated[float | None, described(
        "The most seconds one row may take: a call of n rows past n x this is split in halves, a single row "
        "past it fails with RowTimeout under on_error (name RowTimeout in a rule to retry or skip it).")] = None
    max_failed_rows: Annotated[int | None, described(
        "A failure budget: the refresh stops as soon as more rows than this failed (skipped), committing nothing, "
        "and says how many failed and the first errors.")] = None
    max_failed_fraction: Annotated[float | None, described(
        "A failure budget as a fraction of the rows the refresh checks (0.01: 1%); also the threshold of the "
        "failed_rows_below_threshold check (of the table's rows; default 0).")] = None
    init: Annotated[dict[str, Any] | None, described("Keyword arguments for a class's constructor.")] = None
    name: Annotated[str | None, described("The asset's name (default '<table>__<column>').")] = None
    source_asset: Annotated[str | None, described("The upstream asset that produces the table (default: table).")
                            ] = None
    version: Annotated[str | None, described(
        "Pin the Function version (e.g. a release name); by default a digest of its code and of the project "
        "code and constants it references, so editing them recomputes.")] = None
    workers: Annotated[int, described(
        "GPU workers one refresh spreads over: the stale rows are split into this many shards balanced by rows, "
        "each computed by its own step (its own pod on Kubernetes, its own local slot embedded), and committed "
        "once. The Launchpad's run config can set it per run (ops: <name>: ops: <name>_plan: config: workers).")] = 1
    max_gpus: Annotated[int | None, described(
        "The most GPUs one refresh may hold at once (workers x gpu_count); fewer workers start when it is "
        "lower. The class's max_gpus_per_refresh caps it too.")] = None
    publish_every_rows: Annotated[int | None, described(
        "Publish finished fragments in an intermediate table version whenever this many rows are done, so a "
        "long backfill shows results as it goes (each version holds whole fragments of one Function version); "
        "default: one commit at the end. For a refresh on one worker.")] = None
    checkpoint_seconds: Annotated[float, described(
        "How much work a killed refresh may repeat, in seconds (0: checkpoint every batch).")] = 10.0
    partitions_def: Annotated[Any, dg.Resolver(asset_models.resolve_partitions_def, model_field_type=_PARTITIONS_YAML,
                                               description=(
        "The asset's Dagster partitions (time windows, static, dynamic, two-dimensional); each partition is a "
        "slice of the table named by partition_column or partition_filter."))] = None
    partition_column: Annotated[str | dict[str, str] | None, described(
        "The column a partition is: a date or timestamp column for time windows (rows in the window), a string "
        "(or integer) column holding the key for static and dynamic partitions; for two dimensions, a mapping "
        "dimension -> column. Materializing a partition refreshes those rows only.")] = None
    partition_filter: Annotated[str | None, described(
        "Instead of partition_column, a Lance filter template: {key} (or {<dimension>}, {start}, {end}) is "
        "replaced by a SQL literal, quotes included, e.g. \"lower(source) = {key}\".")] = None
    backfill_policy: Annotated[Any, dg.Resolver(asset_models.resolve_backfill_policy, model_field_type=_BACKFILL_YAML,
                                                description=(
        "Dagster's backfill policy: single_run makes a backfill of a range one run, one refresh of the range's "
        "rows (spread over workers), committed once; default one run per partition."))] = None
    classes_dir: Annotated[str | None, described(
        "The directory of GPU class files gpu_class is checked against (default $GPUFN_CLASSES_DIR or ./classes).")
                           ] = None

def ordered_fields(cls: type) -> list[dataclasses.Field]:
    """A declaration's fields, its own first (a Function's table, column, ...), then the asset
    attributes it shares with every asset (`AssetOptions`)."""
    own = vars(cls).get("__annotations__", {})
    fields = dataclasses.fields(cls)
    return [f for f in fields if f.name in own] + [f for f in fields if f.name not in own]


def option_fields() -> list[tuple[str, Any, str]]:
    """(name, default, description) of every option, in declaration order (`ordered_fields`)."""
    hints = typing.get_type_hints(FunctionOptions, include_extras=True)
    out = []
    for f in ordered_fields(FunctionOptions):
        resolver = next(m for m in hints[f.name].__metadata__ if isinstance(m, dg.Resolver))
        out.append((f.name, f.default, resolver.description))
    return out


def document_options(fn: Any) -> Any:
    """Give `fn` (which takes `**options`) a signature and an Args section listing every option."""
    fields = option_fields()
    params = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY,
                                default=inspect.Parameter.empty if default is dataclasses.MISSING else default)
              for name, default, _ in fields]
    declared = signature(fn)
    kept = [p for p in declared.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    fn.__signature__ = declared.replace(parameters=[*kept, *params])
    lines = "\n".join(f"        {name}: {description}" for name, _, description in fields)
    fn.__doc__ = (fn.__doc__ or "").replace("{options}", lines.strip())
    return fn
