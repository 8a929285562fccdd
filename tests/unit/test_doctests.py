"""The examples in the docstrings of the public API and of small pure helpers run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "gpufn_dagster.assets.function_asset", "gpufn_dagster.assets.checks", "gpufn_dagster.classes", "gpufn_dagster.class_files", "gpufn_dagster.class_requests", "gpufn_dagster.function_spec.code_version",
    "gpufn_dagster.components.function_column", "gpufn_dagster.assets.definitions", "gpufn_dagster.function_spec.functions",
    "gpufn_dagster.k8s_syntax", "gpufn_dagster.function_spec.options", "gpufn_dagster.refresh.batches", "gpufn_dagster.refresh.engine",
    "gpufn_dagster.refresh.execute", "gpufn_dagster.refresh.gpu_stats",
    "gpufn_dagster.refresh.progress", "gpufn_dagster.refresh.reads", "gpufn_dagster.embedded.warm",
    "gpufn_dagster.refresh.signature", "gpufn_dagster.run.capacity", "gpufn_dagster.run.placement",
    "gpufn_dagster.assets.executor", "gpufn_dagster.run.pools", "gpufn_dagster.run.k8s.watch", "gpufn_dagster.run.k8s.informers", "gpufn_dagster.tags", "gpufn_dagster.assets.triggers",
    "gpufn_dagster.assets.views", "gpufn_dagster.embedded.procfs", "gpufn_dagster.embedded.forkserver", "gpufn_dagster.embedded.launcher",
    "gpufn_dagster.refresh.slices", "gpufn_dagster.refresh.state", "gpufn_dagster.function_spec.partitions",
    "gpufn_dagster.assets.reporting", "gpufn_dagster.sample", "gpufn_dagster.assets.table_partitions",
    "gpufn_dagster.run.estimate", "gpufn_dagster.run.history", "gpufn_dagster.run.local_capacity",
    "gpufn_dagster.embedded.coordinator", "gpufn_dagster.run.write_budget", "gpufn_dagster.run.kept_runs", "gpufn_dagster.assets.gpu_time", "gpufn_dagster.assets.table_schemas",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write tables write them here
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
