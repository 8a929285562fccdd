"""What rides on a Function asset, read back from the asset itself: the Function spec, the
Functions whose columns it reads, and the YAML file that declared it.

The spec is stored under one metadata key (`FUNCTION_METADATA_KEY`, as dagster-dbt and
dagster-sling carry their manifest and translator), so it survives Dagster's copies of the asset
(`map_asset_specs`, `Definitions.merge`) and no registry outside the definitions can go stale.
Only the process that loaded the definitions holds the objects; a page served elsewhere shows each
entry's text (`function_metadata`, `reads_metadata`): the code behind the column, the Functions read.
"""

from typing import Any

import dagster as dg
from ..private_ledger import ObjectMetadataValue

from ..function_spec.asset_attributes import AssetAttributes
from ..function_spec.functions import Function
from ..tags import DECLARED_IN_METADATA_KEY, FUNCTION_METADATA_KEY, READS_METADATA_KEY


def _spec_metadata(asset: dg.AssetsDefinition | dg.AssetSpec) -> Any:
    if isinstance(asset, dg.AssetSpec):
        return asset.metadata
    if len(asset.keys) != 1:
        return {}
    return asset.specs_by_key[asset.key].metadata


def function_metadata(function: Function) -> ObjectMetadataValue:
    """The spec itself, for `function_of` in this process; the page (other processes) shows only
    its text: which Python code computes the column, and how it is called.

    >>> def shout(text: str) -> str: return text.upper()
    >>> from gpufn_dagster.function_spec.functions import make_function
    >>> function_metadata(make_function(shout, table="docs", column="loud")).value
    'gpufn_dagster.assets.asset_spec.shout, called per row'
    """
    target = function.target
    name = f"{getattr(target, '__module__', '?')}.{getattr(target, '__qualname__', type(target).__name__)}"
    calls = {"row": "per row", "arrays": "per batch of arrays", "record_batch": "per record batch"}
    text = f"{name}{' (a class)' if function.is_class else ''}, called {calls[function.call_style.value]}"
    return ObjectMetadataValue(text, instance=function)


def reads_metadata(functions: tuple[Function, ...]) -> ObjectMetadataValue:
    """The Functions a Function reads, for `reads` in this process; the page shows their names.

    >>> reads_metadata(()).value
    'none'
    """
    return ObjectMetadataValue(", ".join(f.name for f in functions) or "none", instance=functions)


def function_of(asset: dg.AssetsDefinition | dg.AssetSpec) -> Function | None:
    """The Function behind an asset made by `gpu_function` (None for any other asset).

    It is read from the asset's metadata, so it survives Dagster's copies of the asset
    (`map_asset_specs`, `Definitions.merge`) and cannot be replaced behind the asset's back.
    """
    value = _spec_metadata(asset).get(FUNCTION_METADATA_KEY)
    return value.instance if isinstance(value, ObjectMetadataValue) else None


def reads(asset: dg.AssetsDefinition) -> tuple[Function, ...]:
    """The Functions whose output columns this Function asset reads (recorded by `build_definitions`)."""
    value = _spec_metadata(asset).get(READS_METADATA_KEY)
    return value.instance if isinstance(value, ObjectMetadataValue) else ()


def declared_in(asset: dg.AssetsDefinition) -> str | None:
    """The YAML file that declared a Function asset, None when it was declared in Python."""
    value = _spec_metadata(asset).get(DECLARED_IN_METADATA_KEY)
    return getattr(value, "value", value)


def with_freshness(asset: dg.AssetsDefinition, attributes: AssetAttributes) -> dg.AssetsDefinition:
    """The asset with its declared freshness policy, set on its spec (a graph-backed asset's
    decorator takes none, so every gpufn asset gets it the same way)."""
    policy = attributes.freshness_policy
    return asset if policy is None else asset.map_asset_specs(lambda spec: spec.replace_attributes(freshness_policy=policy))
