"""What a Function's declaration says about its asset as a Dagster asset, beside what gpufn owns.

A Function is a Dagster asset in everything a Dagster asset takes (`dg.AssetSpec`'s attributes),
as dagster-dbt's translator lets a user set key prefix, owners, tags, automation condition and
freshness on every asset it makes. gpufn owns what decides values and placement -- the
dependencies (its table and the Functions it reads), the code version (its Function version), its
own tags and metadata keys -- and takes everything else through untouched
(`assets.function_asset` merges them).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import dagster as dg

from ..errors import FunctionDefinitionError
from ..tags import PREFIX as TAG_PREFIX
from .options import AssetOptions

_KEY_PART = re.compile(r"^[A-Za-z0-9_]+$")  # what a Dagster op name derived from the key can hold


@dataclass(frozen=True)
class AssetAttributes:
    """The asset attributes a declaration gives, as declared (checked by `of`).

    >>> from gpufn_dagster.function_spec.options import AssetOptions
    >>> AssetAttributes.of(AssetOptions(key_prefix="lake", owners=["team:ml"]), "f").key_prefix
    ('lake',)
    >>> AssetAttributes.of(AssetOptions(owners=["nobody"]), "Function 'f'")
    Traceback (most recent call last):
    ...
    gpufn_dagster.errors.FunctionDefinitionError: Function 'f': field 'owners': Invalid owner 'nobody'...
    """

    key_prefix: tuple[str, ...] = ()
    owners: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, Any] = field(default_factory=dict)
    kinds: frozenset[str] = frozenset()
    automation_condition: Any = None
    freshness_policy: Any = None
    legacy_freshness_policy: Any = None

    @classmethod
    def of(cls, options: AssetOptions, label: str) -> AssetAttributes:
        """The attributes `options` declare, each checked as Dagster checks an asset's (its own
        validation, one field at a time, so the error names the field)."""
        key_prefix = options.key_prefix
        prefix = (key_prefix,) if isinstance(key_prefix, str) else tuple(key_prefix or ())
        if bad := [part for part in prefix if not isinstance(part, str) or not _KEY_PART.match(part)]:
            raise FunctionDefinitionError(f"{label}: field 'key_prefix': {bad[0]!r} is not a key part (letters, digits "
                                          "and '_'; a list gives several parts)")
        checks: dict[str, dict[str, Any]] = {
            "owners": {"owners": list(options.owners or [])}, "tags": {"tags": dict(options.tags or {})},
            "metadata": {"metadata": dict(options.metadata or {})}, "kinds": {"kinds": set(options.kinds or [])},
            "automation_condition": {"automation_condition": options.automation_condition},
            "freshness_policy": {"freshness_policy": options.freshness_policy},
            "legacy_freshness_policy": {"legacy_freshness_policy": options.legacy_freshness_policy},
        }
        for name, given in checks.items():
            try:
                with warnings.catch_warnings():  # legacy_freshness_policy is deprecated, still taken
                    warnings.simplefilter("ignore", DeprecationWarning)
                    dg.AssetSpec(**{"key": "x", **given})
            except Exception as err:  # noqa: BLE001 -- Dagster's own check, whatever it raises, names the problem
                said = str(err).replace(" for asset 'AssetKey(['x'])'", "")  # the key checked is a stand-in
                raise FunctionDefinitionError(f"{label}: field {name!r}: {said}") from None
        return cls(prefix, tuple(options.owners or ()), dict(options.tags or {}), dict(options.metadata or {}),
                   frozenset(options.kinds or ()), options.automation_condition, options.freshness_policy,
                   options.legacy_freshness_policy)

    def merged(self, label: str, tags: Mapping[str, str], metadata: Mapping[str, Any],
               kinds: set[str]) -> dict[str, Any]:
        """The asset's attributes, as the asset decorators take them: gpufn's own `tags`, `metadata`
        and `kinds` with the declared ones added, owners, automation condition (and a legacy
        freshness policy); a declared tag or metadata key that gpufn owns is refused, naming it.
        (A new-style freshness policy is set on the asset's spec: a graph-backed asset's decorator takes none.)

        >>> AssetAttributes(tags={"gpufn/gpu-class": "x"}).merged("Function 'f'", {}, {}, set())
        Traceback (most recent call last):
        ...
        gpufn_dagster.errors.FunctionDefinitionError: Function 'f': field 'tags': 'gpufn/gpu-class': the gpufn/ tags are gpufn's own
        """
        for field_name, given, own in (("tags", self.tags, tags), ("metadata", self.metadata, metadata)):
            if taken := sorted(set(given) & set(own)):
                raise FunctionDefinitionError(f"{label}: field {field_name!r}: {', '.join(map(repr, taken))} is gpufn's "
                                              "own (what it says about the asset); choose another key")
        if reserved := sorted(k for k in self.tags if k.startswith(TAG_PREFIX)):
            raise FunctionDefinitionError(f"{label}: field 'tags': {reserved[0]!r}: the {TAG_PREFIX} tags are gpufn's own")
        return {"tags": {**self.tags, **tags}, "metadata": {**self.metadata, **metadata}, "kinds": {*kinds, *self.kinds},
                "owners": list(self.owners) or None, "automation_condition": self.automation_condition,
                **({"legacy_freshness_policy": self.legacy_freshness_policy} if self.legacy_freshness_policy else {})}
