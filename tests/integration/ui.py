"""Helpers for the browser tests: `dagster dev` on the embedded instance, its GraphQL API, headless Chromium."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from gpufn_devcluster import processes

from ..conftest import REPO

ARTIFACTS = Path(__file__).parents[1] / "artifacts"


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps(
        {"query": query, "variables": variables or {}}).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())["data"]


def status(port: int, run_id: str) -> str:
    return graphql(port, '{ runOrError(runId: "%s") { ... on Run { status } } }' % run_id)["runOrError"]["status"]


@contextmanager
def dagster_dev(tmp_path: Path, target: list[str], env: dict[str, str]) -> Iterator[int]:
    """`dagster dev` on `target` (e.g. ["-w", "workspace.yaml"]) with the embedded instance, as the
    README's first command starts it; yields its port once it answers."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    home = tmp_path / "home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster-embedded.yaml", home / "dagster.yaml")
    process = processes.start([sys.executable, "-m", "dagster", "dev", *target, "-p", str(port)], cwd=REPO,
                              env={**os.environ, **env, "DAGSTER_HOME": str(home)}, log=tmp_path / "dagster-dev.log")
    try:
        deadline = time.monotonic() + 240  # generous: a loaded 2-core machine starts dagster dev slowly
        while time.monotonic() < deadline:
            try:
                graphql(port, "{ version }")
                break
            except OSError:
                time.sleep(1)
        yield port
    finally:
        processes.stop(process, grace=30)


@contextmanager
def chromium() -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    # Found when the test runs, not when this module is imported: on a fresh machine the suite
    # installs Debian's chromium after collection (conftest), and a browser test never skips.
    browser, driver_path = shutil.which("chromium"), shutil.which("chromedriver")
    assert browser and driver_path, "Debian's chromium and chromium-driver are missing (the suite installs them as root)"
    options.binary_location = browser
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1600,1000"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def dismiss_dialog(driver, appears_within: float = 3.0) -> None:
    """Close the community dialog the UI shows on a first visit (it fades in after the page)."""
    deadline = time.monotonic() + appears_within
    while time.monotonic() < deadline:
        buttons = driver.find_elements("xpath", "//button[normalize-space()='Skip']")
        if buttons:
            buttons[0].click()
            return
        time.sleep(0.25)


def wait_for_text(driver, needle: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = driver.find_element("tag name", "body").text
        if needle in text:
            return text
        time.sleep(0.5)
    return text


def screenshot(driver, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    driver.save_screenshot(str(ARTIFACTS / name))
