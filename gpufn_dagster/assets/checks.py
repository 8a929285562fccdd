"""Asset checks on Function columns, shown in the UI next to each materialization.

Both read the table as it is now, so they hold across runs:

- unfilled rows: rows without a value -- never computed (appended since the last refresh) or
  failed in their last attempt (under on_error="skip"; the next refresh retries them). It should
  be zero right after a refresh in which nothing failed.
- failed rows: rows whose last computation failed, as a fraction of the table, against a threshold.

A partitioned Function's checks are partitioned alike (Dagster's partitioned asset checks, a
preview in Dagster 1.13): each looks at its partition's slice of the table only.
"""


import warnings
from collections.abc import Iterator, Sequence

import dagster as dg

from ..errors import FunctionDefinitionError
from ..refresh.signature import FAILED
from .asset_spec import function_of
from .reporting import failed_rows_now
from .resources import LanceDBResource
from .run_slice import run_slice


def function_checks(asset: dg.AssetsDefinition, *, max_failed_fraction: float | None = None
                    ) -> Sequence[dg.AssetChecksDefinition]:
    """The two checks of a Function asset made by `gpu_function`, evaluated together in one step
    (one look at the table, one process at most: none when the run's steps run in its worker).

    Args:
        asset: the Function asset.
        max_failed_fraction: the largest fraction of the table's rows that may be failed for
            `failed_rows_below_threshold` to pass (default: the Function's own max_failed_fraction,
            its refreshes' failure budget, else 0: none).

    Example:
        >>> import pyarrow as pa
        >>> from gpufn_dagster import gpu_function
        >>> @gpu_function(table="docs", column="n_chars", on_error="skip")
        ... def n_chars(text: str) -> int:
        ...     return len(text)
        >>> sorted(k.name for c in function_checks(n_chars, max_failed_fraction=0.01) for k in c.check_keys)
        ['failed_rows_below_threshold', 'no_unfilled_rows']
    """
    function = function_of(asset)
    if function is None:
        raise FunctionDefinitionError(f"{asset.key.to_user_string()}: not a gpu_function asset, so it has no Function "
                                      "column to check")
    if max_failed_fraction is None:
        max_failed_fraction = function.options.max_failed_fraction or 0.0
    sig = f"`{function.sig_column}`"
    with warnings.catch_warnings():  # partitioned checks are a preview; the warning would repeat on every load
        warnings.simplefilter("ignore", dg.PreviewWarning)
        unfilled = dg.AssetCheckSpec("no_unfilled_rows", asset=asset.key, blocking=False, partitions_def=function.partitions_def,
                                     description="Every row has a value: none appended since the last refresh, none failed.")
        failed = dg.AssetCheckSpec("failed_rows_below_threshold", asset=asset.key, blocking=False,
                                   partitions_def=function.partitions_def, description=(
                                       f"At most {max_failed_fraction:.2%} of the table's rows failed in their last attempt."))

    @dg.multi_asset_check(specs=[unfilled, failed], name=f"{function.name}_checks", can_subset=True)
    def _checks(context: dg.AssetCheckExecutionContext, lancedb: LanceDBResource) -> Iterator[dg.AssetCheckResult]:
        selected = {key.name for key in context.selected_asset_check_keys}
        files = lancedb.table_files(function.table)
        where = run_slice(context.op_execution_context, function, files)
        dataset = files.dataset()

        def count(condition: str | None = None) -> int:
            """Rows of the table (of the partition's slice) meeting the condition."""
            both = [f"({c})" for c in (condition, where) if c is not None]
            return dataset.count_rows(filter=" AND ".join(both) if both else None)

        rows = count()
        if function.sig_column not in dataset.schema.names:
            if "no_unfilled_rows" in selected:
                yield dg.AssetCheckResult(check_name="no_unfilled_rows", passed=False, metadata={"unfilled_rows": rows},
                                          description="the column has never been refreshed")
            if "failed_rows_below_threshold" in selected:
                yield dg.AssetCheckResult(check_name="failed_rows_below_threshold", passed=True,
                                          description="not refreshed yet")
            return
        failed_rows = count(f"{sig} = {FAILED}")
        if "no_unfilled_rows" in selected:
            never = count(f"{sig} IS NULL")
            yield dg.AssetCheckResult(check_name="no_unfilled_rows", passed=never + failed_rows == 0,
                                      severity=dg.AssetCheckSeverity.WARN,
                                      metadata={"unfilled_rows": never + failed_rows, "never_computed_rows": never,
                                                "failed_rows": failed_rows, "rows": rows})
        if "failed_rows_below_threshold" in selected:
            fraction = failed_rows / rows if rows else 0.0
            named = failed_rows_now(lancedb, function, dataset, where) if failed_rows else {}
            yield dg.AssetCheckResult(check_name="failed_rows_below_threshold", passed=fraction <= max_failed_fraction,
                                      metadata={"failed_rows": failed_rows, "rows": rows,
                                                "failed_fraction": dg.FloatMetadataValue(round(fraction, 6)),
                                                "threshold": dg.FloatMetadataValue(max_failed_fraction),
                                                **({"first_failed_rows": named["failed_rows"],
                                                    "failed_rows_query": named["failed_rows_query"]} if named else {})})

    return [_checks]
