"""In a real browser: `dagster dev` on the embedded instance, a code location with GPU Functions on
two classes and a CPU Function, and the Lineage page's "Materialize all" button: one run, no
placement error, every column filled. The screenshots are kept in tests/artifacts/."""

from __future__ import annotations

import time
from pathlib import Path

import lancedb
import pyarrow as pa

from gpufn_dagster.assets.resources import STABLE_ROW_IDS

from ..conftest import REPO
from .ui import chromium, dagster_dev, dismiss_dialog, graphql, screenshot, wait_for_text

DEFS = Path(__file__).with_name("local_defs.py")
RUNS = "{ runsOrError { ... on Runs { results { runId status tags { key value } } } } }"


def test_materialize_all_across_gpu_classes_just_works(tmp_path):
    db_uri = str(tmp_path / "lancedb")
    gates = tmp_path / "gates"
    gates.mkdir()
    (gates / "open-all").touch()  # local_defs' GPU Function finishes at once here
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1, 2], "text": ["ab", "cde"]}),
                                         storage_options=STABLE_ROW_IDS)
    env = {"GPUFN_LANCEDB_URI": db_uri, "GPUFN_CLASSES_DIR": str(REPO / "classes"), "GPUFN_TEST_GATES": str(gates)}
    with dagster_dev(tmp_path, ["-f", str(DEFS)], env) as port, chromium() as driver:
        driver.get(f"http://127.0.0.1:{port}/asset-groups")
        wait_for_text(driver, "Materialize all", timeout=120)
        dismiss_dialog(driver)
        screenshot(driver, "lineage_before_materialize_all.png")
        driver.find_element("xpath", "//button[contains(., 'Materialize all')]").click()

        deadline = time.monotonic() + 600
        runs: list = []
        while time.monotonic() < deadline:
            runs = graphql(port, RUNS)["runsOrError"]["results"]
            if runs and runs[0]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(2)
        assert len(runs) == 1, runs  # one run for every asset, not one per class
        run = runs[0]
        driver.get(f"http://127.0.0.1:{port}/runs/{run['runId']}")
        wait_for_text(driver, "RUN_SUCCESS" if run["status"] == "SUCCESS" else "RUN_FAILURE", timeout=120)
        dismiss_dialog(driver)
        screenshot(driver, "materialize_all_across_classes.png")
        assert run["status"] == "SUCCESS", run
        tags = {t["key"]: t["value"] for t in run["tags"]}
        assert tags["gpufn/gpu-class"] == "default,l4" and tags["gpufn/placement"] == "local"

    table = lancedb.connect(db_uri).open_table("docs").to_arrow()
    assert table.column("slow").to_pylist() == ["AB@None", "CDE@None"]
    assert table.column("reversed").to_pylist() == ["ba", "edc"] and table.column("size").to_pylist() == [2, 3]
