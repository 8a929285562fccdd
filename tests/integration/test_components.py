"""YAML declarations (Dagster Components): the same assets as the Python decorator, loaded by
`dagster` and `dg`, and errors that name the file and the field."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import dagster as dg
import lancedb
import pyarrow as pa
import pytest
import yaml
from dagster.components import load_defs

from gpufn_dagster import build_definitions
from gpufn_dagster.assets.resources import STABLE_ROW_IDS

from ..conftest import REPO


def asset_view(defs: dg.Definitions) -> dict[str, tuple]:
    graph = defs.resolve_asset_graph()
    out = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        out[key.to_user_string()] = (dict(node.tags), frozenset(node.kinds),
                                     frozenset(k.to_user_string() for k in node.parent_keys), node.code_version)
    return out


@pytest.fixture
def example_modules(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUFN_LANCEDB_URI", str(tmp_path / "lancedb"))
    monkeypatch.syspath_prepend(str(REPO))
    for name in ("definitions", "docs_pipeline.yaml_definitions"):
        sys.modules.pop(name, None)
    python = importlib.import_module("definitions")
    yaml_declared = importlib.import_module("docs_pipeline.yaml_definitions")
    yield python.defs, yaml_declared.defs
    for name in ("definitions", "docs_pipeline.yaml_definitions"):
        sys.modules.pop(name, None)


def test_yaml_and_python_declare_the_same_assets(example_modules):
    python_defs, yaml_defs = example_modules
    python_assets, yaml_assets = asset_view(python_defs), asset_view(yaml_defs)
    assert python_assets == yaml_assets
    assert python_assets["docs__embedding"][0]["gpufn/gpu-class"] == "default"
    assert {"lance", "gpu"} <= python_assets["docs__embedding"][1]
    assert python_assets["docs_en__shout"][2] == {"docs_en"}
    # ...and the same schedule and sensor.
    for kind in ("schedules", "sensors"):
        python_side = {(d.name, getattr(d, "cron_schedule", None)) for d in getattr(python_defs, kind)}
        assert python_side == {(d.name, getattr(d, "cron_schedule", None)) for d in getattr(yaml_defs, kind)}, kind
    assert {d.name for d in yaml_defs.sensors} == {"docs_changed"}


def test_yaml_pipeline_materializes(example_modules, tmp_path):
    _, yaml_defs = example_modules
    selection = [a for a in yaml_defs.assets if a.key.to_user_string() in ("docs", "docs__word_count")]
    assert dg.materialize(selection, resources=yaml_defs.resources).success
    docs = lancedb.connect(str(tmp_path / "lancedb")).open_table("docs")
    assert docs.count_rows("word_count IS NULL") == 0


def test_dg_lists_the_yaml_declared_defs():
    env = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parents[1]), "DAGSTER_HOME": str(REPO / ".gpufn_data")}
    done = subprocess.run([str(Path(sys.executable).with_name("dg")), "list", "defs", "--json"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    listed = json.loads(done.stdout[done.stdout.index("{"):])
    assets = {a["asset_key"]: a for a in listed["assets"]}
    assert assets["docs__word_count"]["source"] == "docs_pipeline/defs/word_count/defs.yaml:1"
    assert {"docs", "docs__embedding", "docs_en", "docs_en__shout"} <= set(assets)


@pytest.fixture
def docs_table(db_uri):
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1], "text": ["a"]}), storage_options=STABLE_ROW_IDS)
    return db_uri


def load_with(tmp_path, monkeypatch, db_uri, **changes):
    """Write one FunctionColumn defs.yaml in a fresh package and load it like a project would."""
    package_attrs = {"table": "docs", "column": "loud", "function": "PKG.udfs:upper", **changes}
    package = f"yamltest_{uuid.uuid4().hex[:8]}"
    folder = tmp_path / package / "defs" / "fn"
    folder.mkdir(parents=True)
    (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / package / "defs" / "__init__.py").write_text("")
    (tmp_path / package / "udfs.py").write_text("def upper(text: str) -> str:\n    return text.upper()\n\n\n"
                                                "def upper_body(body: str) -> str:\n    return body.upper()\n")
    package_attrs["function"] = package_attrs["function"].replace("PKG", package)
    (folder / "defs.yaml").write_text(yaml.safe_dump({"type": "gpufn_dagster.components.FunctionColumn",
                                                      "attributes": package_attrs}))
    monkeypatch.syspath_prepend(str(tmp_path))
    components = load_defs(importlib.import_module(f"{package}.defs"), project_root=tmp_path)
    defs = build_definitions(assets=list(components.assets), db_uri=db_uri)
    return defs, folder / "defs.yaml"


def chain(error: BaseException) -> str:
    """The messages of an error and its causes (Dagster wraps component errors in its own)."""
    messages = []
    while error is not None:
        messages.append(str(error))
        error = error.__cause__ or error.__context__
    return "\n".join(messages)


@pytest.mark.parametrize(("changes", "field", "words"), [
    ({"gpu_class": "v100"}, "gpu_class", "unknown GPU class 'v100'"),
    ({"gpu_class": "l4", "gpu_count": 5}, "gpu_count", "exceeds class 'l4'"),
    ({"function": "PKG.udfs:nope"}, "function", "cannot import"),
    ({"function": "no_such_module:upper"}, "function", "cannot import"),
    ({"table": "nothing"}, "table", "table 'nothing' does not exist"),
    ({"function": "PKG.udfs:upper_body"}, "inputs", "table 'docs' has no column 'body'; it has id, text"),
    ({"inputs": ["id"]}, "inputs", "'id' is not a parameter of the callable, which takes text"),
    ({"output_type": "list<float99>"}, "output_type", "is not an Arrow type"),
    ({"partitions_def": {"type": "static", "partition_keys": ["a"]}, "partition_column": "colour"},
     "partition_column", "table has no column 'colour'"),
    ({"partitions_def": {"type": "daily", "start_date": "2026-01-01"}, "partition_column": "id"},
     "partition_column", "column 'id' is int64: time-window partitions need"),
    ({"on_error": [{"action": "skip", "match": "(unclosed"}]}, "on_error", "not a regular expression"),
    ({"on_error": [{"action": "retry", "attempts": 0}]}, "on_error", "attempts must be at least 1"),
    ({"row_timeout_seconds": 0}, "row_timeout_seconds", "must be above 0"),
    ({"max_failed_fraction": 2}, "max_failed_fraction", "must be between 0 and 1"),
])
def test_bad_yaml_names_file_and_field(tmp_path, monkeypatch, docs_table, changes, field, words):
    with pytest.raises(Exception) as err:
        load_with(tmp_path, monkeypatch, docs_table, **changes)
    message = chain(err.value)
    assert "defs/fn/defs.yaml" in message and f"field '{field}'" in message and words in message, message


def test_unknown_yaml_field_is_rejected_with_its_location(tmp_path, monkeypatch, docs_table):
    with pytest.raises(Exception) as err:
        load_with(tmp_path, monkeypatch, docs_table, colour="blue")
    message = chain(err.value)
    assert "defs.yaml" in message and "colour" in message


def test_a_yaml_function_with_dagsters_partitions_yaml_materializes_one_partition(tmp_path, monkeypatch, db_uri):
    lancedb.connect(db_uri).create_table("docs", pa.table({"id": [1, 2, 3], "text": ["a", "b", "a"]}),
                                         storage_options=STABLE_ROW_IDS)
    defs, _ = load_with(tmp_path, monkeypatch, db_uri, partition_column="text",
                        partitions_def={"type": "static", "partition_keys": ["a", "b"]},
                        backfill_policy={"type": "single_run"})
    (asset,) = [a for a in defs.assets if a.key.to_user_string() == "docs__loud"]
    assert asset.partitions_def.get_partition_keys() == ["a", "b"] and asset.backfill_policy.max_partitions_per_run is None
    assert dg.materialize([asset], resources=defs.resources, instance=dg.DagsterInstance.ephemeral(),
                          partition_key="a").success
    data = lancedb.connect(db_uri).open_table("docs").to_lance().to_table(columns=["id", "loud"]).to_pydict()
    assert data == {"id": [1, 2, 3], "loud": ["A", None, "A"]}


def test_yaml_pins_the_function_version(tmp_path, monkeypatch, docs_table):
    from gpufn_dagster import function_of, make_function

    defs, _ = load_with(tmp_path, monkeypatch, docs_table, version="release-7", description="Loud text.")
    (asset,) = [a for a in defs.assets if a.key.to_user_string() == "docs__loud"]
    function = function_of(asset)
    expected = make_function(function.target, table="docs", column="loud", version="release-7")
    assert function.version == expected.version and function.description == "Loud text."


def test_yaml_error_rules_are_the_same_policy_as_pythons(tmp_path, monkeypatch, docs_table):
    from gpufn_dagster import ErrorPolicy, Retry, Skip, function_of
    from gpufn_dagster.assets.checks import function_checks

    rules = [{"action": "retry", "errors": ["ConnectionError"], "match": "429", "attempts": 4, "backoff_seconds": 0.5,
              "then": "skip"}, {"action": "skip", "errors": ["RowTimeout"]}]
    defs, _ = load_with(tmp_path, monkeypatch, docs_table, on_error=rules, row_timeout_seconds=2.5, max_failed_rows=10,
                        checks=True, max_failed_fraction=0.25)
    (asset,) = [a for a in defs.assets if a.key.to_user_string() == "docs__loud"]
    function = function_of(asset)
    assert function.on_error == ErrorPolicy.of([Retry(ConnectionError, match="429", attempts=4, backoff_seconds=0.5,
                                                      then="skip"), Skip("RowTimeout")])
    assert (function.options.row_timeout_seconds, function.options.max_failed_rows, function.options.max_failed_fraction) == (2.5, 10, 0.25)
    (checks,) = function_checks(asset)  # what the component's `checks: true` adds
    descriptions = {spec.name: spec.description for spec in checks.check_specs}
    assert "25.00%" in descriptions["failed_rows_below_threshold"]  # the check's threshold is the same figure


def test_yaml_classes_in_order_are_the_same_request_as_pythons(tmp_path, monkeypatch, docs_table):
    from gpufn_dagster import function_of

    defs, _ = load_with(tmp_path, monkeypatch, docs_table, gpu_class=["h100-80gb", "a100-80gb"], gpu_count=2)
    (asset,) = [a for a in defs.assets if a.key.to_user_string() == "docs__loud"]
    assert function_of(asset).gpu_classes == ("h100-80gb", "a100-80gb")
    assert asset.op.tags["gpufn/gpu-class"] == "h100-80gb|a100-80gb" and asset.op.pool == "gpu-h100-80gb|a100-80gb"



def test_dg_check_yaml_refuses_an_unknown_function_field_naming_file_line_and_key(tmp_path):
    """The FunctionColumn schema refuses unknown keys: `dg check yaml` of the folder names the file,
    the line and the key (dg 1.13.27 validates one defs.yaml per component type in a whole-project
    run, so the README says to check each folder)."""
    package = tmp_path / "typo_project"
    (package / "defs" / "fn").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "defs" / "__init__.py").write_text("")
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "typo-project"\nversion = "0"\n\n[tool.dg]\ndirectory_type = "project"\n\n'
        '[tool.dg.project]\nroot_module = "typo_project"\ndefs_module = "typo_project.defs"\n')
    (package / "defs" / "fn" / "defs.yaml").write_text(
        "type: gpufn_dagster.components.FunctionColumn\nattributes:\n  table: docs\n  column: n\n"
        "  function: docs_pipeline.udfs:count_words\n  gpu_cont: 1\n")
    env = {**os.environ, "VIRTUAL_ENV": str(Path(sys.executable).parents[1]), "DAGSTER_HOME": str(tmp_path),
           "PYTHONPATH": f"{tmp_path}:{REPO}"}
    done = subprocess.run([str(Path(sys.executable).with_name("dg")), "check", "yaml", "typo_project/defs/fn"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-3000:]
    assert "defs/fn/defs.yaml:6" in out and "'gpu_cont' was unexpected" in out, out[-3000:]
