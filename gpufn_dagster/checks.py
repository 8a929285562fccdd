"""Asset checks on Function columns, shown in the UI next to each materialization.

- unfilled rows: rows the Function has not computed (no signature yet) -- after a refresh this is
  the number of rows appended since; it should be zero right after one.
- failed rows: rows that failed in the latest refresh (under on_error="skip"), against a threshold.
"""


from collections.abc import Sequence

import dagster as dg

from .assets import function_of
from .resources import LanceDBResource


def function_checks(asset: dg.AssetsDefinition, *, max_failed_fraction: float = 0.0) -> Sequence[dg.AssetChecksDefinition]:
    """The two checks of a Function asset made by `gpu_function`."""
    function = function_of(asset)
    if function is None:
        raise ValueError(f"{asset.key.to_user_string()} is not a gpu_function asset")

    @dg.asset_check(asset=asset.key, name="no_unfilled_rows", blocking=False,
                    description="Every row has been computed by the current refresh (none appended since).")
    def _unfilled(lancedb: LanceDBResource) -> dg.AssetCheckResult:
        table = lancedb.connect().open_table(function.table)
        if function.sig_column not in table.schema.names:
            return dg.AssetCheckResult(passed=False, metadata={"unfilled_rows": table.count_rows()},
                                       description="the column has never been refreshed")
        unfilled = table.count_rows(f"{function.sig_column} IS NULL")
        return dg.AssetCheckResult(passed=unfilled == 0, severity=dg.AssetCheckSeverity.WARN,
                                   metadata={"unfilled_rows": unfilled, "rows": table.count_rows()})

    @dg.asset_check(asset=asset.key, name="failed_rows_below_threshold", blocking=False,
                    description=f"At most {max_failed_fraction:.2%} of the rows checked by the latest refresh failed.")
    def _failed(context: dg.AssetCheckExecutionContext) -> dg.AssetCheckResult:
        event = context.instance.get_latest_materialization_event(asset.key)
        if event is None or event.asset_materialization is None:
            return dg.AssetCheckResult(passed=True, description="not refreshed yet")
        metadata = event.asset_materialization.metadata
        failed = int(metadata["rows_failed"].value) if "rows_failed" in metadata else 0
        checked = int(metadata["rows_checked"].value) if "rows_checked" in metadata else 0
        fraction = failed / checked if checked else 0.0
        return dg.AssetCheckResult(passed=fraction <= max_failed_fraction,
                                   metadata={"rows_failed": failed, "rows_checked": checked,
                                             "failed_fraction": dg.FloatMetadataValue(round(fraction, 6)),
                                             "threshold": dg.FloatMetadataValue(max_failed_fraction)})

    return [_unfilled, _failed]
