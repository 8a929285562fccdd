"""Error policies on real Lance tables through Dagster: transient errors retried with backoff then
computed, the first matching rule deciding, a hung call stopped by its row timeout (a batch split
down to the row that hangs), a failure budget that stops the refresh and commits nothing, and the
errors table saying which attempt and which rule."""

from __future__ import annotations

import collections
import time

import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster import ErrorPolicy, Retry, Skip, function_of, gpu_function
from gpufn_dagster.assets.reporting import ERRORS_TABLE

from ..helpers import make_docs, metadata, open_table, run, values

CALLS: collections.Counter[str] = collections.Counter()


@pytest.fixture(autouse=True)
def _reset_calls():
    CALLS.clear()


def rate_limited(text: str) -> str:
    """Rows ending in 3 are refused twice (HTTP 429), then answered; 'doc 7' is refused for good."""
    CALLS[text] += 1
    if text == "doc 7" or (text.endswith("3") and CALLS[text] <= 2):
        raise ConnectionResetError(f"HTTP 429 rate limit for {text!r}")
    if text.endswith("9"):
        raise ValueError(f"cannot shout {text!r}")
    return text.upper()


def errors_table(db_uri: str) -> list[dict]:
    return lancedb.connect(db_uri).open_table(ERRORS_TABLE).to_arrow().to_pylist()


def test_transient_errors_are_retried_then_computed_and_the_rule_that_decided_is_recorded(db_uri):
    make_docs(db_uri, 40)
    policy = [Retry(ConnectionError, match="429", attempts=3, backoff_seconds=0.01, then="skip"), Skip(ValueError)]
    began = time.monotonic()
    result = run(db_uri, gpu_function(table="docs", column="shout", on_error=policy)(rate_limited))
    assert result.success
    got = values(db_uri)
    assert got[13] == "DOC 13" and got[33] == "DOC 33" and got[12] == "DOC 12"  # retried, then computed
    assert CALLS["doc 13"] == 3 and CALLS["doc 12"] == 1 and CALLS["doc 7"] == 3 and CALLS["doc 9"] == 1
    assert got[7] is None and got[9] is None and metadata(result)["rows_failed"] == 5  # 7; 9, 19, 29, 39
    assert time.monotonic() - began >= 4 * 2 * 0.005  # each retried row waited its (jittered) backoff twice
    failed = {e["row_id"]: e for e in errors_table(db_uri)}
    assert set(failed) == {7, 9, 19, 29, 39}
    assert failed[7]["attempt"] == 3 and failed[7]["rule"] == "retry(ConnectionError, match='429', attempts=3, then=skip)"
    assert failed[9]["attempt"] == 1 and failed[9]["rule"] == "skip(ValueError)"
    assert function_of(gpu_function(table="docs", column="x", on_error=policy)(rate_limited)).on_error == \
        ErrorPolicy.of(policy)


def test_an_error_no_rule_matches_fails_the_refresh_naming_row_and_rule(db_uri):
    make_docs(db_uri, 20)
    result = run(db_uri, gpu_function(table="docs", column="shout", on_error=[Skip(KeyError)])(rate_limited))
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert failure.cls_name == "FunctionFailed"
    assert "row id 3" in failure.message and "attempt 1, on_error rule no rule matched" in failure.message
    assert open_table(db_uri).count_rows("shout IS NOT NULL") == 0


def test_a_batch_is_retried_whole_before_it_is_pinned_row_by_row(db_uri):
    make_docs(db_uri, 16)
    batches: list[int] = []

    def flaky_service(text: pa.Array) -> pa.Array:
        batches.append(len(text))
        if len(batches) == 1:
            raise TimeoutError("upstream timed out")
        return pa.array([t.upper() for t in text.to_pylist()])

    result = run(db_uri, gpu_function(table="docs", column="shout", output_type=pa.string(), batch_size=16,
                                      on_error=[Retry(TimeoutError, backoff_seconds=0.01)])(flaky_service))
    assert result.success and batches == [16, 16]  # the same 16 rows again, not 16 calls of one row
    assert values(db_uri)[5] == "DOC 5"


def hangs_on_five(text: pa.Array) -> pa.Array:
    """A batch Function that never returns once it reaches 'doc 5' (a Python-level hang: a polling loop)."""
    items = text.to_pylist()
    CALLS[str(len(items))] += 1
    if "doc 5" in items:
        while True:
            time.sleep(0.01)
    return pa.array([t.upper() for t in items])


def test_a_hung_batch_is_split_down_to_the_row_that_hangs_which_fails_alone(db_uri):
    make_docs(db_uri, 8)
    asset = gpu_function(table="docs", column="shout", output_type=pa.string(), batch_size=8, adapt_batch_size=False,
                         row_timeout_seconds=0.25, on_error=[Skip("RowTimeout")])(hangs_on_five)
    began = time.monotonic()
    result = run(db_uri, asset)
    waited = time.monotonic() - began
    assert result.success and metadata(result)["rows_failed"] == 1
    got = values(db_uri)
    assert got[5] is None and [got[i] for i in (0, 4, 6, 7)] == ["DOC 0", "DOC 4", "DOC 6", "DOC 7"]
    assert CALLS == {"8": 1, "4": 2, "2": 2, "1": 2}  # halves: 8 -> 4+4 -> 2+2 -> 1+1
    assert waited >= (8 + 4 + 2 + 1) * 0.25  # each call of the hanging half waited out its rows x 0.25 s
    (error,) = errors_table(db_uri)
    assert error["row_id"] == 5 and "row_timeout_seconds=0.25" in error["error"] and error["rule"] == "skip(RowTimeout)"


def test_a_hung_row_with_no_rule_for_it_fails_the_refresh_instead_of_hanging(db_uri):
    make_docs(db_uri, 4)

    def stuck(text: str) -> str:
        while text == "doc 2":
            time.sleep(0.01)
        return text.upper()

    result = run(db_uri, gpu_function(table="docs", column="shout", row_timeout_seconds=0.5)(stuck))
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert "row id 2" in failure.message and "ran past row_timeout_seconds=0.5" in failure.message


def every_tenth_fails(text: str) -> str:
    CALLS["all"] += 1
    if text.endswith("0"):
        raise ValueError(f"bad {text!r}")
    return text.upper()


def test_a_refresh_past_its_failure_budget_stops_at_once_and_commits_nothing(db_uri):
    make_docs(db_uri, 2000)
    before = open_table(db_uri).version
    asset = gpu_function(table="docs", column="shout", on_error="skip", batch_size=50, adapt_batch_size=False,
                         max_failed_rows=3)(every_tenth_fails)
    result = run(db_uri, asset)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data.error.cause
    assert failure.cls_name == "FailureBudgetExceeded"
    assert "more than max_failed_rows=3" in failure.message and "committed nothing" in failure.message
    assert "First errors: row id" in failure.message and "bad 'doc " in failure.message
    assert CALLS["all"] < 2000  # it stopped; it did not compute the rest first
    table = open_table(db_uri)
    assert table.version == before + 1 and table.count_rows("shout IS NOT NULL") == 0  # only the column declared


def test_a_refresh_within_its_failure_fraction_commits(db_uri):
    make_docs(db_uri, 200)
    asset = gpu_function(table="docs", column="shout", on_error="skip", max_failed_fraction=0.1)(every_tenth_fails)
    result = run(db_uri, asset)
    assert result.success and metadata(result)["rows_failed"] == 20  # 10% is within 0.1
    assert open_table(db_uri).count_rows("shout IS NOT NULL") == 180
