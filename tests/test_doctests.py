"""The examples in the docstrings of the public API and of small pure helpers run as written."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "gpufn_dagster.assets", "gpufn_dagster.checks", "gpufn_dagster.code_version", "gpufn_dagster.definitions",
    "gpufn_dagster.placement", "gpufn_dagster.refresh.engine", "gpufn_dagster.refresh.signature",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write tables write them here
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0, result
