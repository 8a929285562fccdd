"""What rides on a Function asset, read back from the asset itself: the Function spec, the
Functions whose columns it reads, and the YAML file that declared it.

The spec is stored under one metadata key (`FUNCTION_METADATA_KEY`, as dagster-dbt and
dagster-sling carry their manifest and translator), so it survives Dagster's copies of the asset
(`map_asset_specs`, `Definitions.merge`) and no registry outside the definitions can go stale.
"""

from typing import Any

import dagster as dg
from dagster._core.definitions.metadata.metadata_value import ObjectMetadataValue

from .functions import Function
from .tags import DECLARED_IN_METADATA_KEY, FUNCTION_METADATA_KEY, READS_METADATA_KEY


def _spec_metadata(asset: dg.AssetsDefinition | dg.AssetSpec) -> Any:
    if isinstance(asset, dg.AssetSpec):
        return asset.metadata
    if len(asset.keys) != 1:
        return {}
    return asset.specs_by_key[asset.key].metadata


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
