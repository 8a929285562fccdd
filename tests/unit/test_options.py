"""Unit layer: a Function's options are declared once, and its spec rides on its asset."""

from __future__ import annotations

import dataclasses
import inspect

import dagster as dg
import pyarrow as pa
import pytest

from gpufn_dagster import FunctionDefinitionError, function_of, gpu_function, make_function
from gpufn_dagster.components import FunctionColumn
from gpufn_dagster.function_spec.options import FunctionOptions, ordered_fields

OPTIONS = [f.name for f in ordered_fields(FunctionOptions)]


def test_decorator_spec_builder_and_yaml_component_take_the_same_options():
    decorator = [n for n, p in inspect.signature(gpu_function).parameters.items() if p.kind is p.KEYWORD_ONLY]
    builder = [n for n, p in inspect.signature(make_function).parameters.items() if p.kind is p.KEYWORD_ONLY]
    component = [f.name for f in dataclasses.fields(FunctionColumn)]
    assert decorator == builder == OPTIONS
    assert set(component) - set(OPTIONS) == {"function", "checks"}
    assert {"version", "description", "checkpoint_seconds", "classes_dir"} <= set(OPTIONS)
    yaml_fields = FunctionColumn.model().model_json_schema()["properties"]
    assert all(yaml_fields[name].get("description") for name in OPTIONS), "every YAML field describes itself"
    assert all(f"{name}:" in gpu_function.__doc__ for name in OPTIONS)


def test_defaults_agree_between_python_and_yaml():
    defaults = {f.name: f.default for f in dataclasses.fields(FunctionOptions)}
    signature = inspect.signature(gpu_function).parameters
    assert {n: signature[n].default for n in OPTIONS if defaults[n] is not dataclasses.MISSING} == \
           {n: d for n, d in defaults.items() if d is not dataclasses.MISSING}
    assert defaults["batch_size"] is None and defaults["checkpoint_seconds"] == 10.0


def test_an_unknown_option_is_refused_by_name():
    with pytest.raises(FunctionDefinitionError, match="unknown option 'batchsize'; options: table, column"):
        gpu_function(table="docs", column="n", batchsize=5)(lambda text: 1)


def n_chars(text: str) -> int:
    return len(text)


def n_words(text: str) -> int:
    return len(text.split())


def test_the_spec_rides_on_its_asset_and_is_never_replaced_behind_its_back():
    first = gpu_function(table="docs", column="n")(n_chars)
    second = gpu_function(table="docs", column="n")(n_words)   # same key, another callable
    assert function_of(first).target is n_chars and function_of(second).target is n_words
    copied = first.map_asset_specs(lambda spec: spec.replace_attributes(deps=[*spec.deps, dg.AssetDep("other")]))
    assert function_of(copied) is function_of(first)
    assert function_of(dg.AssetSpec("docs")) is None
    assert function_of(first).inputs == ("text",) and function_of(first).output_type == pa.int64()


def test_a_function_holds_its_options_given_as_keywords_or_as_one_object():
    by_keywords = make_function(n_chars, table="docs", column="n", checkpoint_seconds=2.5, workers=3, max_failed_rows=7)
    options = FunctionOptions(table="docs", column="n", checkpoint_seconds=2.5, workers=3, max_failed_rows=7)
    by_object = make_function(n_chars, options)
    assert by_object.options is options and by_keywords.options == options
    assert (by_keywords.options.checkpoint_seconds, by_keywords.options.workers, by_keywords.options.max_failed_rows) \
        == (2.5, 3, 7)
    assert by_keywords.version == by_object.version
    with pytest.raises(FunctionDefinitionError, match="both as FunctionOptions and as keywords .workers."):
        make_function(n_chars, options, workers=2)


def test_a_runs_config_is_held_to_the_declarations_bounds():
    from gpufn_dagster.assets.function_asset import for_this_run

    function = make_function(n_chars, table="docs", column="n", batch_size=128)
    run = for_this_run(function, {"batch_size": 32, "checkpoint_seconds": 0.0, "publish_every_rows": 100})
    assert (run.max_batch_size, run.batch_size, run.options.checkpoint_seconds, run.options.publish_every_rows) \
        == (32, 32, 0.0, 100)
    assert run.version == function.version and function.options.checkpoint_seconds == 10.0  # the declaration kept
    for config, field in [({"checkpoint_seconds": -1.0}, "checkpoint_seconds"), ({"batch_size": 0}, "batch_size"),
                          ({"publish_every_rows": 0}, "publish_every_rows")]:
        with pytest.raises(FunctionDefinitionError, match=rf"^Function 'docs__n': run config: field '{field}'"):
            for_this_run(function, config)
        with pytest.raises(FunctionDefinitionError, match=rf"field '{field}'"):  # the same bound at load
            make_function(n_chars, table="docs", column="n", **{"batch_size": 128, **config})
