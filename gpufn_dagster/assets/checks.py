"""Asset checks on Function columns, shown in the UI next to each materialization.

Both read the table as it is now, so they hold across runs:

- unfilled rows: rows without a value -- never computed (appended since the last refresh) or
  failed in their last attempt (under on_error="skip"; the next refresh retries them). It should
  be zero right after a refresh in which nothing failed.
- failed rows: rows whose last computation failed, as a fraction of the table, against a threshold.
"""


from collections.abc import Sequence

import dagster as dg

from ..errors import FunctionDefinitionError
from ..refresh.signature import FAILED
from .asset_spec import function_of
from .resources import LanceDBResource


def function_checks(asset: dg.AssetsDefinition, *, max_failed_fraction: float = 0.0) -> Sequence[dg.AssetChecksDefinition]:
    """The two checks of a Function asset made by `gpu_function`.

    Args:
        asset: the Function asset.
        max_failed_fraction: the largest fraction of the table's rows that may be failed for
            `failed_rows_below_threshold` to pass (0: none).

    Example:
        >>> import pyarrow as pa
        >>> from gpufn_dagster import gpu_function
        >>> @gpu_function(table="docs", column="n_chars", on_error="skip")
        ... def n_chars(text: str) -> int:
        ...     return len(text)
        >>> [c.check_key.name for c in function_checks(n_chars, max_failed_fraction=0.01)]
        ['no_unfilled_rows', 'failed_rows_below_threshold']
    """
    function = function_of(asset)
    if function is None:
        raise FunctionDefinitionError(f"{asset.key.to_user_string()}: not a gpu_function asset, so it has no Function "
                                      "column to check")
    sig = f"`{function.sig_column}`"

    @dg.asset_check(asset=asset.key, name="no_unfilled_rows", blocking=False,
                    description="Every row has a value: none appended since the last refresh, none failed.")
    def _unfilled(lancedb: LanceDBResource) -> dg.AssetCheckResult:
        table = lancedb.connect().open_table(function.table)
        if function.sig_column not in table.schema.names:
            return dg.AssetCheckResult(passed=False, metadata={"unfilled_rows": table.count_rows()},
                                       description="the column has never been refreshed")
        never = table.count_rows(f"{sig} IS NULL")
        failed = table.count_rows(f"{sig} = {FAILED}")
        return dg.AssetCheckResult(passed=never + failed == 0, severity=dg.AssetCheckSeverity.WARN,
                                   metadata={"unfilled_rows": never + failed, "never_computed_rows": never,
                                             "failed_rows": failed, "rows": table.count_rows()})

    @dg.asset_check(asset=asset.key, name="failed_rows_below_threshold", blocking=False,
                    description=f"At most {max_failed_fraction:.2%} of the table's rows failed in their last attempt.")
    def _failed(lancedb: LanceDBResource) -> dg.AssetCheckResult:
        table = lancedb.connect().open_table(function.table)
        if function.sig_column not in table.schema.names:
            return dg.AssetCheckResult(passed=True, description="not refreshed yet")
        rows = table.count_rows()
        failed = table.count_rows(f"{sig} = {FAILED}")
        fraction = failed / rows if rows else 0.0
        return dg.AssetCheckResult(passed=fraction <= max_failed_fraction,
                                   metadata={"failed_rows": failed, "rows": rows,
                                             "failed_fraction": dg.FloatMetadataValue(round(fraction, 6)),
                                             "threshold": dg.FloatMetadataValue(max_failed_fraction)})

    return [_unfilled, _failed]
