"""What a Function materialization reports: its Dagster metadata, and failed rows in the errors table.

Shared by a refresh on one worker (`assets`) and one spread over several (`fanout_asset`), so both
report the same figures under the same names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import dagster as dg
import lance
import numpy as np
import pyarrow as pa

from ..classes import GpuClass
from ..refresh.execute import RowError, Rows
from ..refresh.signature import FAILED
from ..refresh.results import RefreshResult
from ..function_spec.functions import Function
from ..private_ledger import EngineEventData
from ..tags import CAPACITY_REASON_TAG, TABLE_VERSION_BEFORE_KEY, CapacityReason
from .resources import LanceDBResource

ERRORS_TABLE = "gpufn_errors"
# One row per failed row, and per retried row that then succeeded (outcome "succeeded"):
# `retried` says the row had failed in an earlier refresh; `attempt`, how many calls included the row
# in this one, and `rule`, the on_error rule that decided.
ERRORS_SCHEMA = pa.schema([
    ("function", pa.string()), ("table", pa.string()), ("columns", pa.string()),
    ("function_version", pa.string()), ("run_id", pa.string()), ("row_address", pa.uint64()), ("row_id", pa.uint64()),
    ("error", pa.string()), ("traceback", pa.string()), ("recorded_at", pa.timestamp("us", tz="UTC")),
    ("retried", pa.bool_()), ("outcome", pa.string()), ("attempt", pa.int32()), ("rule", pa.string()),
    ("error_class", pa.string()), ("inputs", pa.string()),
])
FAILED_ROWS_SHOWN = 20  # the failed rows a materialization lists (`failed_rows_table`); gpufn_errors holds them all


def record_errors(lancedb: LanceDBResource, function: Function, result: RefreshResult, run_id: str) -> None:
    if not result.errors and not result.recovered:
        return
    now = datetime.now(timezone.utc)
    common = {"function": function.name, "table": function.table, "columns": ",".join(function.columns),
              "function_version": function.version, "run_id": run_id, "recorded_at": now}
    rows = pa.Table.from_pylist(
        [{**common, "row_address": e.row_address, "row_id": e.row_id, "error": e.error, "traceback": e.traceback,
          "retried": e.retried, "outcome": "failed", "attempt": e.attempt, "rule": e.rule, "error_class": e.error_class,
          "inputs": e.inputs} for e in result.errors]
        + [{**common, "row_address": address, "row_id": row_id, "retried": True, "outcome": "succeeded"}
           for address, row_id in result.recovered],
        schema=ERRORS_SCHEMA)
    db = lancedb.connect()
    table = db.create_table(ERRORS_TABLE, schema=ERRORS_SCHEMA, exist_ok=True)
    missing = [f for f in ERRORS_SCHEMA if f.name not in table.schema.names]
    if missing:  # a table written by an earlier release: add the new columns (NULL for old rows)
        table.add_columns(missing)
    table.add(rows)


def failed_rows_table(errors: Sequence[RowError], table: str, function: str) -> dict[str, Any]:
    """The first failed rows of a refresh as a table on its materialization: which rows (stable row
    id, first input values), why (error class and message, the rule that decided, the attempts), and
    how to find every one of them in the `gpufn_errors` table.

    >>> from gpufn_dagster.refresh.execute import RowError
    >>> shown = failed_rows_table([RowError(7, "ValueError('bad')", "", row_id=7, rule="skip", error_class="ValueError",
    ...                                     inputs="text='x'")], "docs", "docs__n")
    >>> [r.data["row_id"] for r in shown["failed_rows"].records], shown["failed_rows_query"].value[:23]
    ([7], 'gpufn_errors WHERE func')
    """
    if not errors:
        return {}
    columns = [dg.TableColumn("row_id", "int"), dg.TableColumn("inputs", "string"),
               dg.TableColumn("error_class", "string"), dg.TableColumn("error", "string"),
               dg.TableColumn("rule", "string"), dg.TableColumn("attempt", "int")]
    records = [dg.TableRecord({"row_id": e.row_id if e.row_id is not None else e.row_address, "inputs": e.inputs or "",
                               "error_class": e.error_class or "", "error": e.error[:300], "rule": e.rule or "",
                               "attempt": e.attempt}) for e in errors[:FAILED_ROWS_SHOWN]]
    return {"failed_rows": dg.TableMetadataValue(records, dg.TableSchema(columns)),
            "failed_rows_query": dg.TextMetadataValue(
                f"{ERRORS_TABLE} WHERE function = '{function}' AND outcome = 'failed' (every failed row of table "
                f"{table!r}, newest last; the table's own rows: `_rowid IN (row_id, ...)`)")}


def failed_rows_now(lancedb: LanceDBResource, function: Function, dataset: lance.LanceDataset,
                    where: str | None) -> dict[str, Any]:
    """The first rows of the table (of `where`'s slice) whose last computation failed, each with the
    error `gpufn_errors` recorded for it, as `failed_rows_table` shows them: what the Function's
    check names beside the count."""
    failed = f"`{function.sig_column}` = {FAILED}" + (f" AND ({where})" if where else "")
    columns = [c for c in function.inputs if c in dataset.schema.names][:2]
    rows = dataset.to_table(columns=columns, filter=failed, with_row_id=dataset.has_stable_row_ids,
                            with_row_address=True, limit=FAILED_ROWS_SHOWN)
    if not rows.num_rows:
        return {}
    ids = rows.column("_rowid").to_pylist() if "_rowid" in rows.column_names else [None] * rows.num_rows
    addresses = rows.column("_rowaddr").to_pylist()
    recorded: dict[int, dict[str, Any]] = {}
    db = lancedb.connect()
    if ERRORS_TABLE in lancedb.table_names(db):
        matches = db.open_table(ERRORS_TABLE).to_lance().to_table(filter=(
            f"function = '{function.name}' AND outcome = 'failed' AND row_address IN ({', '.join(map(str, addresses))})"))
        for entry in sorted(matches.to_pylist(), key=lambda e: e["recorded_at"]):
            recorded[entry["row_address"]] = entry  # the latest record of each row
    inputs = pa.record_batch([rows.column(c).combine_chunks() for c in columns], names=columns)
    errors = [RowError(address, (recorded.get(address) or {}).get("error") or "", "",
                       row_id=row_id, attempt=(recorded.get(address) or {}).get("attempt") or 1,
                       rule=(recorded.get(address) or {}).get("rule"),
                       error_class=(recorded.get(address) or {}).get("error_class"), inputs=Rows.values(i, inputs))
              for i, (address, row_id) in enumerate(zip(addresses, ids, strict=True))]
    return failed_rows_table(errors, function.table, function.name)


INTERRUPTS = (KeyboardInterrupt, dg.DagsterExecutionInterruptedError)  # how a terminated run's step is stopped


def termination_cause(run: dg.DagsterRun) -> str:
    """Who terminated a run, as far as the instance knows: gpufn itself after a wait past a class's
    max_wait, else a person or tool asking Dagster to terminate it (Dagster records no user).

    >>> termination_cause(dg.DagsterRun(job_name="j", run_id="r", tags={}))
    "a termination request (the run page's Terminate, or GraphQL terminateRun)"
    """
    if run.tags.get(CAPACITY_REASON_TAG) == CapacityReason.MAX_WAIT_EXCEEDED.value:
        return "gpufn, after its GPU step waited past its class's max_wait"
    return "a termination request (the run page's Terminate, or GraphQL terminateRun)"


def report_terminated(context: Any, function: Function, rows_checkpointed: int) -> None:
    """Say on the run's page what a terminated refresh leaves: nothing committed, its checkpoints,
    and how to resume -- so a terminated run does not read as the Function's crash."""
    run = context.instance.get_run_by_id(context.run.run_id) or context.run
    who = termination_cause(run)
    context.instance.report_engine_event(
        f"{function.name}: terminated by {who}; nothing was committed, {rows_checkpointed:,} rows are checkpointed: "
        "re-execute the run (or materialize again) to resume from them", run,
        EngineEventData({"Terminated by": who, "Rows checkpointed": rows_checkpointed, "Committed": "nothing",
                         "Resume": "re-execute the run, or materialize again"}),
        step_key=context.get_step_execution_context().step.key)


NO_GPU_BILLED = "no GPU was visible to the worker: it computed on the CPU, and no GPU time is billed"


def device_used(devices: tuple[str, ...]) -> str:
    """The device a worker computed on, as the materialization says it.

    >>> device_used(()), device_used(("NVIDIA L4", "NVIDIA L4"))
    ('cpu', 'NVIDIA L4 x2')
    """
    if not devices:
        return "cpu"
    names = sorted(set(devices))
    return ", ".join(f"{n} x{devices.count(n)}" if devices.count(n) > 1 else n for n in names)


def gpu_billing(function: Function, gpu_class: GpuClass | None, gpu_seconds: float, on_gpu: bool,
                loading_seconds: float = 0.0) -> dict[str, Any]:
    """GPU-seconds and cost of a GPU Function's refresh, billed only when a GPU was visible to it.

    `gpu_seconds` (what `cost_usd` bills) is the worker's whole time on its GPUs: loading the
    Function's model and computing rows. The two parts are reported apart, `gpu_seconds_loading`
    (`loading_seconds` x GPUs; 0 when a warm instance was reused) and `gpu_seconds_computing`.

    >>> from gpufn_dagster.classes import GpuClass
    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> t4 = GpuClass(name="default", gpu_model="T4", gpu_memory="16GiB", max_gpu_count_per_worker=1,
    ...               price_per_gpu_hour=0.36)
    >>> def f(x: int) -> int: return x
    >>> fn = make_function(f, table="t", column="y", gpu=True)
    >>> {k: v.value if hasattr(v, "value") else v for k, v in gpu_billing(fn, t4, 3600.0, on_gpu=True).items()}
    {'gpu_class': 'default', 'gpu_seconds': 3600.0, 'gpu_seconds_loading': 0.0, 'gpu_seconds_computing': 3600.0, 'cost_usd': 0.36}
    >>> {k: v.value for k, v in gpu_billing(fn, t4, 100.0, on_gpu=True, loading_seconds=30.0).items() if "seconds" in k}
    {'gpu_seconds': 100.0, 'gpu_seconds_loading': 30.0, 'gpu_seconds_computing': 70.0}
    >>> sorted(gpu_billing(fn, t4, 3600.0, on_gpu=False))
    ['gpu_billing', 'gpu_class', 'gpu_seconds']
    """
    if not function.gpu_count or gpu_class is None:
        return {}
    if not on_gpu:
        return {"gpu_class": gpu_class.name, "gpu_seconds": dg.FloatMetadataValue(0.0), "gpu_billing": NO_GPU_BILLED}
    loading = min(float(loading_seconds) * function.gpu_count, float(gpu_seconds))
    billed: dict[str, Any] = {"gpu_class": gpu_class.name,
                              "gpu_seconds": dg.FloatMetadataValue(round(float(gpu_seconds), 3)),
                              "gpu_seconds_loading": dg.FloatMetadataValue(round(loading, 3)),
                              "gpu_seconds_computing": dg.FloatMetadataValue(round(float(gpu_seconds) - loading, 3))}
    if gpu_class.price_per_gpu_hour is not None:
        billed["cost_usd"] = dg.FloatMetadataValue(round(gpu_seconds / 3600 * gpu_class.price_per_gpu_hour, 6))
    return billed


@dataclass(frozen=True)
class WorkerFigures:
    """What the worker(s) of a refresh did, as the materialization reports it: the one worker's own
    figures, or a fanned-out refresh's taken as a whole (`fanout_asset.fanout_figures`)."""

    wall_seconds: float
    rows_computed: int
    rows_per_second: float
    busy_fraction: float | None  # None: nothing computed, so nothing to say
    load_seconds: float
    first_values_seconds: float | None
    devices: tuple[str, ...]  # the GPUs the worker(s) saw (none: the CPU)
    gpu_seconds: float | None  # wall time x GPUs of the work that saw a GPU (None: no worker ran)
    batch_rows_largest: int | None = None
    first_call_seconds: float | None = None  # of `first_values_seconds`, the call that computed them
    rows_adopted: int = 0  # rows whose values came from a killed run's checkpoints: checked, not computed
    parts_adopted: int = 0  # the checkpointed parts they came in, each checksum-verified
    parts_damaged: int = 0  # checkpointed parts that failed their checksum and were computed again
    gpu_held_seconds: float | None = None  # a fan-out: its shards' GPUs held (x GPUs); None: not measured
    gpu_idle_seconds: float | None = None  # of those, the time no Function call ran on them

    @classmethod
    def of(cls, function: Function, result: RefreshResult) -> WorkerFigures:
        """A refresh on one worker: its result's figures."""
        return cls(result.wall_seconds, result.rows_computed, result.rows_per_second,
                   result.busy_fraction if result.first_values_seconds is not None else None, result.load_seconds,
                   result.first_values_seconds, result.devices, result.wall_seconds * function.gpu_count,
                   result.batch_rows_largest if result.first_values_seconds is not None else None,
                   result.first_call_seconds, result.rows_adopted, result.parts_adopted, result.parts_damaged)

    def adopted(self) -> str | None:
        """What the run log says of the parts this refresh took from earlier ones (None: none).

        >>> WorkerFigures(1.0, 0, 0.0, None, 0.0, None, (), None, rows_adopted=900, parts_adopted=3).adopted()
        'adopted 3 checkpointed part(s) (900 rows) that earlier refreshes saved, checksums verified'
        """
        said = []
        if self.parts_adopted:
            said.append(f"adopted {self.parts_adopted:,} checkpointed part(s) ({self.rows_adopted:,} rows) that earlier "
                        "refreshes saved, checksums verified")
        if self.parts_damaged:
            said.append(f"{self.parts_damaged:,} checkpointed part(s) failed their checksum and were computed again")
        return "; ".join(said) or None


def refresh_metadata(function: Function, gpu_class: GpuClass | None, result: RefreshResult,
                     figures: WorkerFigures | None = None) -> dict[str, Any]:
    """What each materialization reports, as Dagster metadata: the table's side from `result`, the
    workers' from `figures` (default: `result`'s own, a refresh on one worker)."""
    work = figures or WorkerFigures.of(function, result)
    metadata: dict[str, Any] = {
        "rows_computed": work.rows_computed,
        "rows_adopted": work.rows_adopted,
        "parts_adopted": work.parts_adopted,
        "parts_damaged": work.parts_damaged,
        "rows_failed": result.rows_failed,
        "rows_retried_ok": len(result.recovered),
        "rows_checked": result.rows_checked,
        "fragments_visited": f"{result.fragments_visited}/{result.fragments_total}",
        "fragments_rewritten": result.fragments_rewritten,
        TABLE_VERSION_BEFORE_KEY: result.version_before,
        "table_version_after": result.version_after,
        "function_version": result.function_version,
        "wall_seconds": dg.FloatMetadataValue(round(work.wall_seconds, 3)),
        "rows_per_second": dg.FloatMetadataValue(round(work.rows_per_second, 1)),
        "dagster/row_count": result.rows_total,
    }
    if work.load_seconds >= 0.05 or work.rows_computed:  # 0 when the rows went to a warm instance
        metadata["load_seconds"] = dg.FloatMetadataValue(round(work.load_seconds, 2))
    if work.first_values_seconds is not None:
        metadata["first_values_seconds"] = dg.FloatMetadataValue(round(work.first_values_seconds, 2))
    if work.first_call_seconds is not None:  # the rest of first_values_seconds is the engine's: plan, lease, reads
        metadata["first_call_seconds"] = dg.FloatMetadataValue(round(work.first_call_seconds, 2))
    if work.busy_fraction is not None:
        metadata["busy_fraction"] = dg.FloatMetadataValue(round(work.busy_fraction, 3))
    if work.batch_rows_largest is not None:
        metadata["batch_rows_largest"] = work.batch_rows_largest
    if result.oom_splits:
        metadata["oom_splits"] = result.oom_splits
        metadata["batch_rows_that_fit"] = result.batch_rows_that_fit
    metadata.update({name: dg.FloatMetadataValue(value) for name, value in result.gpu.items()})
    if result.fragments_compacted:
        metadata["fragments_compacted"] = result.fragments_compacted
    if result.versions_published:
        metadata["versions_published"] = result.versions_published
    metadata.update(failed_rows_table(result.errors, function.table, function.name))
    if result.lease_wait_seconds >= 0.5:
        metadata["waited_for_other_refresh_seconds"] = dg.FloatMetadataValue(round(result.lease_wait_seconds, 1))
    if work.rows_computed:
        metadata["device"] = device_used(work.devices)
    if work.gpu_held_seconds is not None:
        metadata["gpu_held_seconds"] = dg.FloatMetadataValue(round(work.gpu_held_seconds, 3))
        metadata["gpu_idle_seconds"] = dg.FloatMetadataValue(round(work.gpu_idle_seconds, 3))
    if work.gpu_seconds is not None:
        metadata.update(gpu_billing(function, gpu_class, work.gpu_seconds, bool(work.devices), work.load_seconds))
    return metadata


def partition_figures(function: Function, dataset: lance.LanceDataset, keys: Sequence[str], metadata: dict[str, Any],
                      computed_rows: np.ndarray, errors: Sequence[RowError]) -> dict[str, dict[str, Any]]:
    """Each partition's own figures, when one refresh covered several (a single-run backfill): the
    rows of its own filter the refresh checked, computed and failed (`computed_rows`: the addresses
    given a value; `dataset`: the table at the version the refresh read), and its share of the
    refresh's GPU-seconds and cost by the rows it computed. The refresh's time and rate are the
    same for every partition (one refresh computed them all); rows adopted from checkpoints are
    counted for the refresh only.

    >>> import lance, pyarrow as pa, tempfile
    >>> ds = lance.write_dataset(pa.table({"day": ["a", "a", "b"]}), tempfile.mkdtemp() + "/t.lance")
    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> f = make_function(lambda day: 1, table="t", column="n", output_type="int64",
    ...                   partitions_def=dg.StaticPartitionsDefinition(["a", "b", "c"]), partition_column="day")
    >>> figures = partition_figures(f, ds, ["a", "b", "c"], {}, np.array([0, 1], dtype=np.uint64), [])
    >>> [(k, v["rows_checked"], v["rows_computed"]) for k, v in figures.items()]
    [('a', 2, 2), ('b', 1, 0), ('c', 0, 0)]
    """
    partitioning = function.partitioning
    assert partitioning is not None
    types = {f.name: f.type for f in dataset.schema}
    failed = np.array([e.row_address for e in errors], dtype=np.uint64)
    total = len(computed_rows)
    out = {}
    for key in keys:
        window = (partitioning.partitions_def.time_window_for_partition_key(key)
                  if isinstance(partitioning.partitions_def, dg.TimeWindowPartitionsDefinition) else None)
        where = partitioning.where([key], types, window)
        rows = dataset.to_table(columns=[], filter=where, with_row_address=True).column("_rowaddr").to_numpy()
        computed = int(np.isin(rows, computed_rows).sum())
        share = computed / total if total else 1 / len(keys)
        out[key] = {"partition_filter": where, "rows_checked": len(rows), "rows_computed": computed,
                    "rows_failed": int(np.isin(rows, failed).sum()),
                    **{name: dg.FloatMetadataValue(round(metadata[name].value * share, 6))
                       for name in ("gpu_seconds", "gpu_seconds_loading", "gpu_seconds_computing", "cost_usd")
                       if name in metadata}}
    return out


def projection(function: Function, gpu_class: GpuClass | None, rows_computed: int, compute_seconds: float,
               rows_left: int) -> dict[str, Any]:
    """A pilot's forecast for the rest of the table: the rows not computed yet, and the hours (GPU-hours
    for a GPU Function) and cost they take at the rate just measured (rows per second of computing,
    model loading left out: the full refresh loads once).

    1,000 rows in 10 s of computing on 2 L4s at $0.80 an hour each; 360,000 rows left:

    >>> from gpufn_dagster.classes import GpuClass
    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> l4 = GpuClass(name="l4", gpu_model="L4", gpu_memory="24GiB", max_gpu_count_per_worker=2, price_per_gpu_hour=0.8)
    >>> pair = make_function(lambda x: x, table="t", column="y", gpu_class="l4", gpu_count=2, output_type="int64")
    >>> {k: getattr(v, "value", v) for k, v in projection(pair, l4, 1000, 10.0, 360_000).items()}
    {'projected_rows_left': 360000, 'projected_hours': 1.0, 'projected_gpu_hours': 2.0, 'projected_cost_usd': 1.6}
    """
    if rows_computed <= 0 or compute_seconds <= 0:
        return {}
    hours = rows_left / (rows_computed / compute_seconds) / 3600
    out: dict[str, Any] = {"projected_rows_left": rows_left, "projected_hours": dg.FloatMetadataValue(round(hours, 6))}
    if function.gpu_count:
        out["projected_gpu_hours"] = dg.FloatMetadataValue(round(hours * function.gpu_count, 6))
        if gpu_class is not None and gpu_class.price_per_gpu_hour is not None:
            out["projected_cost_usd"] = dg.FloatMetadataValue(
                round(hours * function.gpu_count * gpu_class.price_per_gpu_hour, 4))
    return out
