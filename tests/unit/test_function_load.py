"""A Function checked when its definitions load: the tags, kinds and version its asset carries, and
the errors that name the field and list what is valid. Pure: no table, instance or server."""

from __future__ import annotations

import importlib
import os
import sys
import textwrap
import time
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from gpufn_dagster import FunctionDefinitionError, function_of, gpu_function, make_function
from gpufn_dagster.function_spec.functions import CallStyle


def lambda_free_double(price: float) -> float:
    return price * 2


def upper(text: str) -> str:
    return text.upper()


class Tagger:
    """A class Function whose constructor needs an argument (`init=`)."""

    def __init__(self, prefix: str):
        self.prefix = prefix

    def __call__(self, text: pa.Array) -> pa.Array:
        return pc.binary_join_element_wise(self.prefix, text, "")


def test_asset_carries_class_tags_kinds_version_and_lineage():
    asset = gpu_function(table="items", column="emb", output_type=pa.list_(pa.float32()), gpu_class="l4", gpu_count=2)(
        lambda_free_double)
    spec = asset.specs_by_key[dg.AssetKey("items__emb")]
    assert spec.tags["gpufn/gpu-class"] == "l4" and spec.tags["gpufn/gpu-count"] == "2"
    assert {"lance", "gpu"} <= spec.kinds
    assert dg.AssetKey("items") in {dep.asset_key for dep in spec.deps}
    assert spec.code_version == function_of(asset).version
    assert asset.op.tags["gpufn/gpu-class"] == "l4"
    cpu = gpu_function(table="items", column="x", output_type=pa.float64())(lambda_free_double)
    cpu_spec = cpu.specs_by_key[dg.AssetKey("items__x")]
    assert "cpu" in cpu_spec.kinds and "gpufn/gpu-class" not in cpu_spec.tags


def test_no_class_means_default_and_version_changes_with_options():
    a = function_of(gpu_function(table="items", column="y", gpu=True)(lambda_free_double))
    b = function_of(gpu_function(table="items", column="y", gpu=True, batch_size=7)(lambda_free_double))
    c = function_of(gpu_function(table="items", column="y", gpu=True, init={"k": 1})(lambda_free_double))
    assert a.gpu_class == "default"
    assert a.version == b.version  # batch size does not change values
    assert a.version != c.version


def test_a_class_request_refused_at_load_names_the_function_the_field_and_the_class_files(monkeypatch):
    """The rule is `class_requests.accept`'s (test_class_requests); the load prefixes the Function and
    names the directory the classes came from."""
    with pytest.raises(FunctionDefinitionError) as err:
        gpu_function(table="items", column="y", gpu_class="a100-40gb")(lambda_free_double)
    message = str(err.value)
    assert message.startswith("Function 'items__y': field 'gpu_class': unknown GPU class 'a100-40gb' "
                              "(did you mean 'a100-80gb'?)")
    assert "a100-80gb, a100-mig-1g-10gb, default, h100-80gb, l4" in message and "(class files in " in message
    with pytest.raises(FunctionDefinitionError, match=r"^Function 'items__y': field 'gpu_count': 2 GPUs exceeds"):
        gpu_function(table="items", column="y", gpu=True, gpu_count=2)(lambda_free_double)


def test_classes_in_order_are_one_request_refused_at_load_when_one_cannot_serve_it():
    asset = gpu_function(table="items", column="y", gpu_class=["h100-80gb", "a100-80gb"], gpu_count=4)(
        lambda_free_double)
    function = function_of(asset)
    assert function.gpu_classes == ("h100-80gb", "a100-80gb") and function.gpu_class == "h100-80gb|a100-80gb"
    assert asset.op.tags["gpufn/gpu-class"] == "h100-80gb|a100-80gb" and asset.op.pool == "gpu-h100-80gb|a100-80gb"
    spec = asset.specs_by_key[dg.AssetKey("items__y")]
    assert "gpufn/gpu-class" not in spec.tags and spec.metadata["gpu_class"] == "h100-80gb|a100-80gb"
    with pytest.raises(FunctionDefinitionError, match=r"field 'gpu_class': \['l4', 'l4'\] names a class twice"):
        gpu_function(table="items", column="y", gpu_class=["l4", "l4"])(lambda_free_double)
    with pytest.raises(FunctionDefinitionError, match=r"field 'gpu_class': a list of GPU class names"):
        gpu_function(table="items", column="y", gpu_class=[])(lambda_free_double)


def test_uninferable_output_type_asks_for_one():
    def untyped(text):
        return text

    with pytest.raises(FunctionDefinitionError, match="field 'output_type'"):
        gpu_function(table="items", column="z")(untyped)


def test_inputs_that_do_not_match_the_parameters_fail_at_load_naming_the_parameter():
    def two(text: str, price: float) -> str:
        return text

    with pytest.raises(FunctionDefinitionError, match=r"Function 'two': field 'inputs': 'colour' is not a parameter "
                                                      r"of the callable, which takes text, price"):
        gpu_function(table="items", column="y", inputs=["text", "colour"])(two)
    with pytest.raises(FunctionDefinitionError, match=r"Function 'two': parameter 'price': the callable requires it"):
        gpu_function(table="items", column="y", inputs=["text"])(two)

    def with_default(text: str, suffix: str = "!") -> str:
        return text + suffix

    assert function_of(gpu_function(table="items", column="y", inputs=["text"])(with_default)).inputs == ("text",)
    with pytest.raises(FunctionDefinitionError, match=r"Function 'Tagger': parameter 'prefix'.*init"):
        gpu_function(table="items", column="t", output_type=pa.string())(Tagger)


def test_a_batch_function_must_name_its_value_type():
    def lengths(text: pa.Array) -> list[int]:  # the annotation describes the batch, not one value
        return [len(t) for t in text.to_pylist()]

    with pytest.raises(FunctionDefinitionError, match=r"Function 'lengths': field 'output_type': a batch Function"):
        gpu_function(table="items", column="n")(lengths)
    assert function_of(gpu_function(table="items", column="n", output_type=pa.int64())(lengths)).call_style is (
        CallStyle.ARRAYS)


def test_a_gpu_function_with_zero_gpus_is_refused_at_load():
    with pytest.raises(FunctionDefinitionError, match=r"Function 'upper': field 'gpu_count': a GPU Function needs "
                                                      r"at least 1 GPU, got 0"):
        gpu_function(table="docs", column="u", gpu_class="l4", gpu_count=0)(upper)


def test_an_unknown_output_type_name_is_refused_at_load():
    with pytest.raises(FunctionDefinitionError, match=r"Function 'upper': field 'output_type': 'int65' is not an "
                                                      r"Arrow type"):
        gpu_function(table="docs", column="u", output_type="int65")(upper)
    spec = make_function(upper, table="docs", column="u", output_type="list<string>")
    assert spec.output_type == pa.list_(pa.string())


def test_a_function_cannot_write_its_own_input():
    with pytest.raises(FunctionDefinitionError, match=r"Function 'upper': field 'column': 'text' is also an input"):
        gpu_function(table="docs", column="text")(upper)


def write_module(root: Path, name: str, source: str):
    (root / f"{name}.py").write_text(textwrap.dedent(source))
    importlib.invalidate_caches()
    sys.modules.pop(name, None)
    return importlib.import_module(name)


def test_the_version_covers_helpers_and_constants_the_function_references(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    name = f"udf_{os.getpid()}_{time.monotonic_ns()}"
    base = '''
        import helpers_{n} as helpers
        SUFFIX = "!"
        def clean(text):
            return text.strip()
        def shout(text: str) -> str:
            return helpers.loud(clean(text)) + SUFFIX
    '''.replace("{n}", name)
    write_module(tmp_path, f"helpers_{name}", "def loud(t):\n    return t.upper()\n")
    version = make_function(write_module(tmp_path, name, base).shout, table="t", column="c").version

    def version_after(helpers: str | None = None, module: str | None = None) -> str:
        write_module(tmp_path, f"helpers_{name}", helpers or "def loud(t):\n    return t.upper()\n")
        return make_function(write_module(tmp_path, name, module or base).shout, table="t", column="c").version

    assert version_after() == version  # same code, same version
    assert version_after(module=base.replace('SUFFIX = "!"', 'SUFFIX = "?"')) != version  # a constant
    assert version_after(module=base.replace("text.strip()", "text.strip('x')")) != version  # a helper here
    assert version_after(helpers="def loud(t):\n    return t.upper() + ' '\n") != version  # a helper elsewhere

    function = write_module(tmp_path, name, base).shout
    skip = make_function(function, table="t", column="c", on_error="skip")
    assert skip.version == make_function(function, table="t", column="c", on_error="fail").version
    pinned = function_of(gpu_function(table="t", column="c", version="release-7")(function))
    assert pinned.version == make_function(function, table="t", column="c", version="release-7").version
    assert pinned.version != version
