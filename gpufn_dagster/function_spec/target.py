"""How a Function's callable travels to another process: by where it is defined, never by value
and never by the name its module now binds.

`pickle` sends a function or class by reference -- its module and qualified name -- and refuses
when that name no longer holds the same object. A decorated Function is exactly that case:
`@gpu_function(...)` on `def n_chars` or `class Embedder` rebinds the module's name to the asset,
and `lancedb.udf` rebinds it to its UDF wrapper. A Function's callable therefore travels as a
`TargetRef` (module, qualified name, the module's file), and the receiving process resolves it
through whatever the name holds there: the callable itself, a `lancedb.udf` wrapper's function,
or a Function asset's own callable (read back from the asset, as `function_of` does). Every form
the README writes -- a decorated `def` or `class`, `gpu_function(...)(f)`, a `lancedb.udf`, a
YAML Function's import path -- resolves to the callable it was declared with; a lambda or a
closure, which no other process can import, is refused, saying why.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..private_ledger import ObjectMetadataValue, udf_function
from ..errors import FunctionDefinitionError
from ..tags import FUNCTION_METADATA_KEY


def unwrap(target: Any) -> Any:
    """The callable a Function computes with, behind what a module's name may hold: a
    `lancedb.udf` definition's function, a Function asset's callable, or the object itself.

    >>> import textwrap
    >>> unwrap(textwrap.dedent) is textwrap.dedent
    True
    """
    original = udf_function(target)
    if getattr(target, "registration_request", None) is not None and original is not None:
        return original
    specs = getattr(target, "specs_by_key", None)  # a Dagster AssetsDefinition of one asset
    if isinstance(specs, Mapping) and len(specs) == 1:
        value = next(iter(specs.values())).metadata.get(FUNCTION_METADATA_KEY)
        if isinstance(value, ObjectMetadataValue):
            return value.instance.target
    return target


@dataclass(frozen=True)
class TargetRef:
    """Where a Function's callable is defined: enough for another process to import it.

    >>> import textwrap
    >>> TargetRef.of(textwrap.dedent).resolve() is textwrap.dedent
    True
    >>> TargetRef.of(lambda text: text).resolve()
    Traceback (most recent call last):
    ...
    gpufn_dagster.errors.FunctionDefinitionError: gpufn_dagster.function_spec.target.<lambda> is not defined at a module's top level ...
    """

    module: str
    qualname: str
    file: str | None  # the module's file: a code location's `python_file` is not importable by name

    @classmethod
    def of(cls, target: Any) -> TargetRef:
        module = getattr(target, "__module__", None) or "?"
        return cls(module, getattr(target, "__qualname__", type(target).__qualname__),
                   getattr(sys.modules.get(module), "__file__", None))

    def resolve(self) -> Any:
        """The callable, imported in this process (its module loaded first if it is not yet)."""
        where = f"{self.module}.{self.qualname}"
        if "<" in self.qualname:
            raise FunctionDefinitionError(
                f"{where} is not defined at a module's top level (a lambda or a closure), so no other process can "
                "import it")
        found: Any = _module(self.module, self.file)
        for part in self.qualname.split("."):
            try:
                found = getattr(found, part)
            except AttributeError:
                raise FunctionDefinitionError(f"{where}: module {self.module!r} defines no {part!r}") from None
        return unwrap(found)


def _module(name: str, file: str | None) -> Any:
    """Import `name` by name when this process can, else from its file (a code location's
    `python_file`, which Dagster loads under the file's name without putting its folder on sys.path)."""
    if name in sys.modules:
        return sys.modules[name]
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name != name or file is None:
            raise
    spec = importlib.util.spec_from_file_location(name, file)
    if spec is None or spec.loader is None:
        raise FunctionDefinitionError(f"module {name!r} cannot be loaded from {file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # As Dagster loads a python_file: its folder on sys.path while it runs, so its own imports of
    # modules beside it resolve.
    folder = os.path.dirname(os.path.abspath(file))
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]  # a half-run module must not answer the next import
        raise
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)
    return module
