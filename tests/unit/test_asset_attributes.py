"""A Function is a Dagster asset in everything a Dagster asset takes: every form the README writes
passes AssetSpec's attributes through to its asset, beside gpufn's own, and refuses only what the
Function owns, naming the field."""

from __future__ import annotations

import dagster as dg
import lancedb
import pyarrow as pa
import pytest

from gpufn_dagster import FunctionDefinitionError, LanceDBResource, function_of, gpu_function, materialized_view_asset

EAGER = dg.AutomationCondition.eager()
ATTRIBUTES = dict(owners=["team:ml", "ada@example.com"], tags={"tier": "gold"}, metadata={"runbook": "https://x/y"},
                  kinds=["pytorch"], automation_condition=EAGER, group_name="embeddings", description="Embeds docs.")


def _freshness() -> dg.FreshnessPolicy:
    from datetime import timedelta

    return dg.FreshnessPolicy.time_window(fail_window=timedelta(hours=1))


def as_def(**options):
    @gpu_function(table="docs", column="n", **options)
    def n(text: str) -> int:
        return len(text)

    return n


def as_class(**options):
    @gpu_function(table="docs", column="n", gpu_class="l4", **options)
    class Counter:
        def __call__(self, text: str) -> int:
            return len(text)

    return Counter


def as_call(**options):
    def n(text: str) -> int:
        return len(text)

    return gpu_function(table="docs", column="n", **options)(n)


def as_udf(**options):
    @lancedb.udf
    def n(text: str) -> int:
        return len(text)

    return gpu_function(table="docs", column="n", **options)(n)


def as_fanout(**options):
    def embed(text: pa.Array) -> pa.Array:
        return pa.array([float(len(t)) for t in text.to_pylist()])

    return gpu_function(table="docs", column="n", output_type=pa.float64(), gpu_class="l4", workers=4, **options)(embed)


FORMS = [as_def, as_class, as_call, as_udf, as_fanout]


@pytest.mark.parametrize("form", FORMS, ids=lambda f: f.__name__)
def test_every_form_passes_the_asset_attributes_through_beside_gpufns_own(form):
    asset = form(**ATTRIBUTES, freshness_policy=_freshness(), key_prefix=["lake", "v2"])
    spec = asset.specs_by_key[asset.key]
    assert asset.key == dg.AssetKey(["lake", "v2", "docs__n"]) == function_of(asset).asset_key
    assert spec.owners == ["team:ml", "ada@example.com"] and spec.group_name == "embeddings"
    assert spec.tags["tier"] == "gold" and "gpufn/gpu-count" in spec.tags  # gpufn's own tags kept
    assert {"pytorch", "lance"} <= spec.kinds
    assert spec.metadata["runbook"] == "https://x/y" and "function_version" in spec.metadata
    assert spec.automation_condition == EAGER and spec.freshness_policy == _freshness()
    assert spec.description == "Embeds docs." and spec.code_version == function_of(asset).version
    assert all(op.startswith("lake__v2__docs__n") for op in asset.node_def.name.split(",")), asset.node_def.name


def test_two_functions_of_the_same_table_and_column_live_side_by_side_under_their_prefixes():
    ours, theirs = as_def(key_prefix="ours"), as_def(key_prefix="theirs")
    defs = dg.Definitions(assets=[ours, theirs], resources={"lancedb": LanceDBResource(uri="unused")})
    keys = {k.to_user_string() for k in defs.resolve_asset_graph().get_all_asset_keys()}
    assert {"ours/docs__n", "theirs/docs__n"} <= keys


@pytest.mark.parametrize(("options", "field"), [
    ({"deps": ["other"]}, "deps"),
    ({"code_version": "7"}, "code_version"),
    ({"tags": {"gpufn/gpu-class": "a100-80gb"}}, "tags"),
    ({"metadata": {"function_version": "mine"}}, "metadata"),
    ({"owners": ["nobody"]}, "owners"),
    ({"key_prefix": ["lake house"]}, "key_prefix"),
    ({"automation_condition": "eager"}, "automation_condition"),
])
def test_what_the_function_owns_or_dagster_refuses_is_refused_naming_the_field(options, field):
    with pytest.raises(FunctionDefinitionError) as err:
        as_def(**options)
    assert f"'{field}'" in str(err.value) and str(err.value).startswith(("Function 'n'", "Function 'docs__n'")), \
        str(err.value)


def test_a_legacy_freshness_policy_is_taken_too():
    legacy = dg.LegacyFreshnessPolicy(maximum_lag_minutes=30)
    asset = as_def(legacy_freshness_policy=legacy)
    assert asset.specs_by_key[asset.key].legacy_freshness_policy == legacy


def test_a_materialized_view_takes_the_same_attributes():
    view = materialized_view_asset("docs_en", source="docs", where="lang = 'en'", **ATTRIBUTES,
                                   freshness_policy=_freshness(), key_prefix="lake")
    spec = view.specs_by_key[view.key]
    assert view.key == dg.AssetKey(["lake", "docs_en"]) and spec.owners == ATTRIBUTES["owners"]
    assert {"pytorch", "view", "lance"} <= spec.kinds and spec.automation_condition == EAGER
    assert spec.metadata["runbook"] == "https://x/y" and spec.metadata["where"] == "lang = 'en'"
    with pytest.raises(FunctionDefinitionError, match="view 'v': option 'deps'"):
        materialized_view_asset("v", source="docs", deps=["x"])
