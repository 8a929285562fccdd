"""The example pipeline: it loads, materializes end to end (a real embedding model on CPU), and
`dagster dev` serves it and runs a Materialize request like the UI's button."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
import urllib.request
from pathlib import Path

import dagster as dg
import lancedb
import numpy as np
import pytest

from gpufn_dagster import function_of
from gpufn_devcluster import processes

from ..conftest import REPO


@pytest.fixture
def example(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("GPUFN_LANCEDB_URI", str(tmp_path / "lancedb"))
    monkeypatch.syspath_prepend(str(REPO))
    sys.modules.pop("definitions", None)
    import definitions

    yield definitions
    sys.modules.pop("definitions", None)


def test_example_materializes_embeddings_counts_and_view(example, tmp_path):
    defs = example.defs
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert keys == {"docs", "docs__embedding", "docs__word_count", "docs_en", "docs_en__shout"}
    assert {s.name for s in defs.schedules} == {"nightly_docs_refresh"}
    assert {s.name for s in defs.sensors} == {"docs_changed"}  # gpu_capacity is for Kubernetes only
    result = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    docs = lancedb.connect(str(tmp_path / "lancedb")).open_table("docs").to_arrow()
    vectors = np.array(docs.column("embedding").to_pylist(), dtype=np.float32)
    assert vectors.shape == (500, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    first = docs.slice(0, 1).to_pylist()[0]
    assert first["word_count"] == len(first["text"].split())
    # Similar sentences embed closer than unrelated ones: the model is real.
    model = function_of(example.embedding).open()
    a, b, c = (model(pa_array([t])).to_pylist()[0] for t in
               ("The GPU computes the column.", "A GPU fills the column.", "Le noeud attend la grappe."))
    assert np.dot(a, b) > np.dot(a, c)


def pa_array(texts):
    import pyarrow as pa

    return pa.array(texts)


def graphql(port: int, query: str, variables: dict | None = None) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{port}/graphql", data=json.dumps(
        {"query": query, "variables": variables or {}}).encode(), headers={"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(request, timeout=30).read())["data"]


LAUNCH = """
mutation($params: ExecutionParams!) { launchRun(executionParams: $params) {
  __typename ... on LaunchRunSuccess { run { runId } } ... on PythonError { message } } }"""


def test_dagster_dev_serves_the_example_and_runs_materialize(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "DAGSTER_HOME": str(tmp_path / "home"), "GPUFN_LANCEDB_URI": str(tmp_path / "lancedb")}
    (tmp_path / "home").mkdir()
    process = processes.start([sys.executable, "-m", "dagster", "dev", "-w", "workspace.yaml", "-p", str(port)],
                              cwd=REPO, env=env, log=tmp_path / "dagster-dev.log")
    try:
        # Generous deadlines: they guard against hangs on a loaded 2-core machine, they time nothing.
        deadline = time.monotonic() + 240
        nodes = None
        while time.monotonic() < deadline:
            try:
                nodes = graphql(port, "{ assetNodes { assetKey { path } tags { key value } } }")["assetNodes"]
                break
            except OSError:
                time.sleep(1)
        assert nodes, "dagster dev did not come up"
        tags = {"/".join(n["assetKey"]["path"]): {t["key"]: t["value"] for t in n["tags"]} for n in nodes}
        assert tags["docs__embedding"]["gpufn/gpu-class"] == "default"
        # What the UI's Materialize button sends: the implicit asset job with an asset selection.
        params = {"selector": {"repositoryLocationName": "gpufn_example", "repositoryName": "__repository__",
                               "jobName": "__ASSET_JOB", "assetSelection": [{"path": ["docs"]},
                                                                            {"path": ["docs__word_count"]}]},
                  "mode": "default", "executionMetadata": {"tags": []}}
        launched = graphql(port, LAUNCH, {"params": params})["launchRun"]
        assert launched["__typename"] == "LaunchRunSuccess", launched
        run_id = launched["run"]["runId"]
        status = None
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            status = graphql(port, '{ runOrError(runId: "%s") { ... on Run { status } } }' % run_id)["runOrError"]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                break
            time.sleep(1)
        assert status == "SUCCESS"
        docs = lancedb.connect(str(tmp_path / "lancedb")).open_table("docs")
        assert docs.count_rows("word_count IS NULL") == 0
    finally:
        processes.stop(process, grace=60)  # a slow graceful shutdown on a loaded machine is not the test
