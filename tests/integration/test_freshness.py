"""A freshness policy on a Function is Dagster's: its asset page carries it, and Dagster's freshness
daemon says the column is fresh after a refresh and failed once the policy's window has passed."""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa

from gpufn_dagster.assets.resources import STABLE_ROW_IDS


def test_a_functions_freshness_policy_passes_after_a_refresh_and_fails_past_its_window(tmp_path, monkeypatch):
    from dagster._core.definitions.freshness import FreshnessState
    from dagster._core.test_utils import create_test_daemon_workspace_context, freeze_time, instance_for_test
    from dagster._core.workspace.load_target import PythonFileTarget
    from dagster._daemon.freshness import FreshnessDaemon

    monkeypatch.setenv("GPUFN_LANCEDB_URI", str(tmp_path / "lancedb"))
    lancedb.connect(tmp_path / "lancedb").create_table("docs", pa.table({"id": [0, 1], "text": ["a", "b"]}),
                                                      storage_options=STABLE_ROW_IDS)
    defs_file = Path(__file__).with_name("freshness_defs.py")
    target = PythonFileTarget(python_file=str(defs_file), attribute="defs", working_directory=str(defs_file.parent),
                              location_name="freshness")
    key = dg.AssetKey("docs__loud")
    with instance_for_test() as instance, create_test_daemon_workspace_context(target, instance) as workspace:
        node = workspace.create_request_context().asset_graph.get(key)
        assert node.freshness_policy is not None  # what the asset page shows

        def state(at: float) -> FreshnessState:
            with freeze_time(at):
                list(FreshnessDaemon().run_iteration(workspace))
            return instance.get_freshness_state_records([key])[key].freshness_state

        monkeypatch.syspath_prepend(str(defs_file.parent))
        loaded = importlib.import_module("freshness_defs").defs  # the code location's module, materialized here
        assert dg.materialize([loaded.resolve_assets_def(key)], instance=instance).success  # its resources ride on it
        now = time.time()
        assert state(now + 60) == FreshnessState.PASS
        assert state(now + 2 * 3600) == FreshnessState.FAIL
