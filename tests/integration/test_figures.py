"""The figures a materialization and its progress lines show are what happened, measured here
against a Function that sleeps a known time per row: rows computed (a value given), rows adopted
from another refresh's checkpoints (a resumed run), and the rate over the computed rows alone --
the same figure in the last progress line and the materialization."""

from __future__ import annotations

import re
import time

import dagster as dg
import pyarrow as pa
import pytest

from gpufn_dagster import gpu_function, make_function, refresh_column

from ..helpers import make_docs, metadata, run

SECONDS_PER_ROW = 0.002
CALLS: list[tuple[int, float]] = []  # (rows, seconds) of each call, as this test measures it


def sleepy(text: pa.Array) -> pa.Array:
    began = time.monotonic()
    time.sleep(SECONDS_PER_ROW * len(text))
    CALLS.append((len(text), time.monotonic() - began))
    return pa.array([t.upper() for t in text.to_pylist()])


def sleepy_row(text: str) -> str:
    began = time.monotonic()
    time.sleep(SECONDS_PER_ROW)
    CALLS.append((1, time.monotonic() - began))
    return text.upper()


def measured_rate() -> float:
    return sum(rows for rows, _ in CALLS) / sum(seconds for _, seconds in CALLS)


def last_progress_rate(instance: dg.DagsterInstance, result: dg.ExecuteInProcessResult) -> int:
    lines = [e.message for e in instance.all_logs(result.run_id) if e.message and " rows checked, " in e.message]
    return int(re.search(r"([\d,]+) rows/s", lines[-1]).group(1).replace(",", ""))


@pytest.mark.parametrize("function", [sleepy, sleepy_row], ids=["gpu-batch", "cpu-row"])
def test_a_first_fill_reports_the_rate_it_computed_at_in_its_progress_and_its_materialization(db_uri, function):
    CALLS.clear()
    make_docs(db_uri, 800)
    gpu = {"output_type": pa.string(), "gpu_class": "default"} if function is sleepy else {}
    asset = gpu_function(table="docs", column="loud", **gpu)(function)
    instance = dg.DagsterInstance.ephemeral()
    result = run(db_uri, asset, instance)
    found = metadata(result)
    assert (found["rows_computed"], found["rows_adopted"], found["rows_failed"]) == (800, 0, 0)
    assert abs(found["rows_per_second"] - measured_rate()) <= 0.2 * measured_rate(), (found, measured_rate())
    assert abs(last_progress_rate(instance, result) - found["rows_per_second"]) <= 1  # one figure for one fact


def test_a_resumed_refresh_counts_the_rows_it_adopted_apart_and_its_rate_over_the_rows_it_computed(db_uri):
    """A refresh stopped after 400 of 800 rows (its checkpoints saved every call) is resumed by
    another: 400 rows adopted, 400 computed, and the rate is that of the 400."""
    make_docs(db_uri, 800)
    uri = f"{db_uri}/docs.lance"

    def stopping(text: pa.Array) -> pa.Array:
        if sum(rows for rows, _ in CALLS) >= 400:
            raise KeyboardInterrupt  # as a terminated run's step is stopped
        return sleepy(text)

    stopping.__qualname__ = stopping.__name__ = "sleepy"  # the same Function version as `sleepy`
    spec = dict(table="docs", column="loud", output_type=pa.string(), batch_size=100, adapt_batch_size=False,
                checkpoint_seconds=0, version="v1")
    CALLS.clear()
    with pytest.raises(KeyboardInterrupt):
        refresh_column(uri, make_function(stopping, **spec), prefetch=0)
    CALLS.clear()
    resumed = refresh_column(uri, make_function(sleepy, **spec), prefetch=0)
    assert (resumed.rows_computed, resumed.rows_adopted, resumed.rows_checked) == (400, 400, 800)
    assert sum(rows for rows, _ in CALLS) == 400  # the adopted rows were not computed again
    assert abs(resumed.rows_per_second - measured_rate()) <= 0.2 * measured_rate(), (resumed, measured_rate())
