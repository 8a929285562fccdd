"""In a real browser: `dagster dev` on the example definitions with the embedded instance
(deploy/dagster-embedded.yaml: local GPU slots), a second GPU run's step waits for class
`default`'s only slot, and its run page in headless Chromium says so, why, since when and behind
whom -- in the event log, no dialog opened. The screenshots are kept in tests/artifacts/."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import lancedb
import pytest

from gpufn_dagster.resources import STABLE_ROW_IDS
from gpufn_dagster.sample import sample_docs

from ..conftest import REPO

ARTIFACTS = Path(__file__).parents[1] / "artifacts"
CHROMIUM, CHROMEDRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps(
        {"query": query, "variables": variables or {}}).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())["data"]


LAUNCH = """mutation($p: ExecutionParams!) { launchRun(executionParams: $p) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


def launch(port: int, *assets: str) -> str:
    params = {"selector": {"repositoryLocationName": "gpufn_example", "repositoryName": "__repository__",
                           "jobName": "__ASSET_JOB", "assetSelection": [{"path": [a]} for a in assets]},
              "mode": "default"}
    result = graphql(port, LAUNCH, {"p": params})["launchRun"]
    assert result["__typename"] == "LaunchRunSuccess", result
    return result["run"]["runId"]


def status(port: int, run_id: str) -> str:
    return graphql(port, '{ runOrError(runId: "%s") { ... on Run { status } } }' % run_id)["runOrError"]["status"]


@pytest.fixture
def dagster_dev(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster-embedded.yaml", home / "dagster.yaml")  # the embedded default's instance config
    env = {**os.environ, "DAGSTER_HOME": str(home), "GPUFN_LANCEDB_URI": str(tmp_path / "lancedb"),
           "GPUFN_CLASSES_DIR": str(REPO / "classes")}
    process = subprocess.Popen([sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)],
                               cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    deadline = time.monotonic() + 240  # generous: a loaded 2-core machine starts dagster dev slowly
    while time.monotonic() < deadline:
        try:
            graphql(port, "{ version }")
            break
        except OSError:
            time.sleep(1)
    yield port, env["GPUFN_LANCEDB_URI"]
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)


def dismiss_dialog(driver) -> None:
    for button in driver.find_elements("xpath", "//button[normalize-space()='Skip']"):
        button.click()  # the first-visit community dialog


def wait_for_text(driver, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = driver.find_element("tag name", "body").text
        if needle in text:
            return text
        time.sleep(0.5)
    return text


@pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER), reason="needs Debian's chromium and chromium-driver")
def test_run_page_shows_the_wait_for_gpu_capacity(dagster_dev):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    port, db_uri = dagster_dev
    # Enough documents that embedding them on CPU holds class default's only slot for a minute or more.
    lancedb.connect(db_uri).create_table("docs", sample_docs(15_000), storage_options=STABLE_ROW_IDS)
    holder = launch(port, "docs__embedding")
    waiting = launch(port, "docs__embedding")

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        # The run page, as it is: started, and its event log says its GPU step waits, for which
        # class, why, since when (the event's time) and behind whom.
        driver.get(f"http://127.0.0.1:{port}/runs/{waiting}")
        page = wait_for_text(driver, "waits for a local GPU slot of class 'default'", timeout=600)
        dismiss_dialog(driver)
        ARTIFACTS.mkdir(exist_ok=True)
        driver.save_screenshot(str(ARTIFACTS / "run_waiting_for_gpu_capacity.png"))
        flat = page.replace("\n", " ")
        assert status(port, waiting) == "STARTED"  # a started run whose GPU step waits: never failed, never on CPU
        assert "Step blocked by limit for pool gpu-default" in flat  # Dagster's own line
        assert f"all 1 slot(s) in use (run {holder[:8]} step docs__embedding); first in line" in flat, flat

        # The runs list: its tags say it waits for class default, why, and since when.
        driver.get(f"http://127.0.0.1:{port}/runs")
        listing = wait_for_text(driver, "gpufn/capacity")
        dismiss_dialog(driver)
        driver.save_screenshot(str(ARTIFACTS / "runs_list_waiting.png"))
        tags = graphql(port, '{ runOrError(runId: "%s") { ... on Run { tags { key value } } } }' % waiting)
        tags = {t["key"]: t["value"] for t in tags["runOrError"]["tags"]}
        assert tags["gpufn/capacity"] == "waiting" and tags["gpufn/capacity-reason"] == "LocalSlotsInUse", tags
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", tags["gpufn/waiting-since"])  # a time a person reads
        assert "waiting" in listing

        # When the slot frees, the page says the wait ended.
        driver.get(f"http://127.0.0.1:{port}/runs/{waiting}")
        wait_for_text(driver, "Its GPU steps got their local GPU slots after waiting", timeout=900)
        driver.save_screenshot(str(ARTIFACTS / "run_started_after_waiting.png"))
    finally:
        driver.quit()

    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and status(port, waiting) not in ("SUCCESS", "FAILURE"):
        time.sleep(2)
    assert status(port, holder) == "SUCCESS" and status(port, waiting) == "SUCCESS"
