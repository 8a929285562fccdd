"""In a real browser: `dagster dev` with the embedded instance (deploy/dagster-embedded.yaml: local
GPU slots) and the shipped classes, a second GPU run's step waits for class `default`'s only slot,
and its run page in headless Chromium says so, why, since when and behind whom -- in the event log,
no dialog opened. The run holding the slot is held by local_defs' gate until the page has been
read, so the wait lasts exactly as long as the test looks at it, however loaded the machine.
The screenshots are kept in tests/artifacts/."""

from __future__ import annotations

import time
from pathlib import Path

import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster.assets.resources import STABLE_ROW_IDS

from ..conftest import REPO
from .ui import chromium, dagster_dev, dismiss_dialog, graphql, screenshot, status, wait_for_text

DEFS = Path(__file__).with_name("local_defs.py")
LOCATION = '{ workspaceOrError { ... on Workspace { locationEntries { name } } } }'
LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


def launch(port: int, *assets: str) -> str:
    (location,) = [e["name"] for e in graphql(port, LOCATION)["workspaceOrError"]["locationEntries"]]
    params = {"selector": {"repositoryLocationName": location, "repositoryName": "__repository__",
                           "jobName": "__ASSET_JOB", "assetSelection": [{"path": [a]} for a in assets]},
              "mode": "default"}
    result = graphql(port, LAUNCH, {"p": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


# Its own waits (dagster dev starting, the browser's pages, both runs) add up to more than the
# suite's 600 s on a loaded 2-core machine; they guard hangs.
@pytest.mark.timeout(1800)
def test_run_page_shows_the_wait_for_gpu_capacity(tmp_path):
    db_uri = str(tmp_path / "lancedb")
    gates = tmp_path / "gates"
    gates.mkdir()
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1, 2], "text": ["ab", "cde"]}),
                                         storage_options=STABLE_ROW_IDS)
    env = {"GPUFN_LANCEDB_URI": db_uri, "GPUFN_CLASSES_DIR": str(REPO / "classes"), "GPUFN_TEST_GATES": str(gates)}
    with dagster_dev(tmp_path, ["-f", str(DEFS)], env) as port, chromium() as driver:
        try:
            _wait_shown(port, gates, driver)
        finally:
            (gates / "open-all").touch()  # whatever happened, no run is left holding the slot


def _wait_for_slot_taken(port: int, runs: set[str], timeout: float = 600) -> tuple[str, str]:
    """(the run holding class default's only slot, the run whose step waits for it), from the pool as
    Dagster's own GraphQL reports it."""
    query = ('{ instance { concurrencyLimit(concurrencyKey: "gpu-default") '
             '{ claimedSlots { runId } pendingSteps { runId assignedTimestamp } } } }')
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pool = graphql(port, query)["instance"]["concurrencyLimit"]
        held = {s["runId"] for s in pool["claimedSlots"]}
        waits = {s["runId"] for s in pool["pendingSteps"] if s["assignedTimestamp"] is None}
        if len(held) == 1 and held | waits == runs:
            return held.pop(), waits.pop()
        time.sleep(1)
    raise AssertionError(f"timed out after {timeout}s waiting for one of {sorted(runs)} to hold the slot, the other to wait")


def _wait_shown(port: int, gates: Path, driver) -> None:
    launched = {launch(port, "docs__slow"), launch(port, "docs__slow")}
    # Both start at once, so either may claim the slot first (their run workers start side by side):
    # the one holding it is the holder (held at its gate until the test opens it), the other must wait.
    holder, waiting = _wait_for_slot_taken(port, launched)
    assert status(port, waiting) == "STARTED"  # a started run whose GPU step waits: never failed, never on CPU

    # The run page, as it is: started, and its event log says its GPU step waits, for which
    # class, why, since when (the event's time) and behind whom.
    driver.get(f"http://127.0.0.1:{port}/runs/{waiting}")
    page = wait_for_text(driver, "waits for a local GPU slot of class 'default'", timeout=600)
    # And roughly when it starts: this instance has no finished run of the work yet, so "unknown", saying why.
    page = wait_for_text(driver, "Wait estimate: unknown (0 runs ahead on default, 1 GPU in the class; no finished "
                                 "run of docs__slow", timeout=120)
    # Dagster's own line, which its executor may write just after the coordinator's.
    page = wait_for_text(driver, "Step blocked by limit for pool gpu-default", timeout=60)
    dismiss_dialog(driver)
    screenshot(driver, "run_waiting_for_gpu_capacity.png")
    flat = page.replace("\n", " ")
    assert status(port, waiting) == "STARTED"  # a started run whose GPU step waits: never failed, never on CPU
    assert "Step blocked by limit for pool gpu-default" in flat  # Dagster's own line
    assert f"all 1 slot(s) in use (run {holder[:8]} step docs__slow); first in line" in flat, flat

    # The runs list: three gpufn tags a run, the ones a user filters by -- the waiting run's say it
    # waits, the holder's that it has the GPU; why and since when are on the run page (above), and
    # the bookkeeping behind them is hidden (Dagster's `.dagster/` tags), never shown.
    driver.get(f"http://127.0.0.1:{port}/runs")
    listing = wait_for_text(driver, "gpufn/capacity")
    dismiss_dialog(driver)
    screenshot(driver, "runs_list_waiting.png")
    for run_id, state in ((waiting, "waiting"), (holder, "running")):
        tags = graphql(port, '{ runOrError(runId: "%s") { ... on Run { tags { key value } } } }' % run_id)
        shown = {t["key"]: t["value"] for t in tags["runOrError"]["tags"] if "gpufn" in t["key"]}
        assert shown == {"gpufn/gpu-class": "default", "gpufn/capacity": state, "gpufn/placement": "local"}, shown
    assert "waiting" in listing, listing
    assert "capacity-reason" not in listing and "waiting-since" not in listing, listing

    # When the slot frees, the page says the wait ended.
    (gates / "open-1").touch()  # the holder finishes (local_defs: the first step to get the slot drew ticket 1)
    (gates / "open-2").touch()  # and the waiter, once it has the slot, finishes at once
    driver.get(f"http://127.0.0.1:{port}/runs/{waiting}")
    wait_for_text(driver, "Its GPU steps got their local GPU slots after waiting", timeout=900)
    screenshot(driver, "run_started_after_waiting.png")

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and status(port, waiting) not in ("SUCCESS", "FAILURE"):
        time.sleep(2)
    assert status(port, holder) == "SUCCESS" and status(port, waiting) == "SUCCESS"
