"""What a Function's version covers: its own code and the user code and constants it references.

Editing a helper the Function calls, or a module constant it reads, changes what it computes, so
it must make every row stale just like editing the Function itself. Like lancedb's packaging of a
`@udf` (which inlines literals and packages referenced definitions by source), this walks the
module-level names the source references, recursively:

- functions and classes defined in the project (not in the standard library or an installed
  package): their source, and what *they* reference;
- attributes reached through a project module (`helpers.clean`): the same, per attribute;
- literals (numbers, strings, bytes, None, and tuples/lists/dicts/sets of them): their value;
- anything else (installed libraries, modules, objects): its import path or type only, since its
  code is versioned by the package that ships it.

Decorators, comments and formatting do not count. The walk reads source text and never calls
user code. Pure: same code in, same digest out.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import inspect
import sys
import sysconfig
import textwrap
import types
from pathlib import Path
from typing import Any

_LITERALS = (int, float, complex, str, bytes, bool, type(None))
_MAX_LITERAL = 100_000  # characters of a constant's repr that count; longer ones count by hash
_INSTALLED = tuple({str(Path(p).resolve()) for p in (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"],
                                                       sysconfig.get_paths()["stdlib"])})


@functools.lru_cache(maxsize=1)
def _distributed_packages() -> frozenset[str]:
    """Top-level packages that installed distributions provide (editable installs included)."""
    return frozenset(importlib.metadata.packages_distributions())


def _is_project_module(module_name: str | None, roots: frozenset[str] = frozenset()) -> bool:
    """A module whose source the user edits: in the Function's own top-level package (`roots`,
    installed or not), or outside the standard library and every installed distribution
    (an editable install of a library lives outside site-packages, but is still a library)."""
    if not module_name or module_name in sys.builtin_module_names:
        return False
    top = module_name.partition(".")[0]
    if module_name == "__main__" or top in roots:
        return True
    path = getattr(sys.modules.get(module_name), "__file__", None)
    if not path:
        return False
    resolved = str(Path(path).resolve())
    if resolved.startswith(_INSTALLED) or "site-packages" in resolved:
        return False
    return top not in _distributed_packages()


def _literal(value: Any, depth: int = 0) -> str | None:
    """A stable text for a literal constant, or None when the value is not one."""
    if type(value) in _LITERALS:
        text = repr(value)
    elif type(value) in (tuple, list, set, frozenset) and depth < 5:
        items = [_literal(v, depth + 1) for v in value]
        if any(i is None for i in items):
            return None
        text = f"{type(value).__name__}({sorted(items) if isinstance(value, (set, frozenset)) else items})"
    elif type(value) is dict and depth < 5:
        items = [(_literal(k, depth + 1), _literal(v, depth + 1)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        text = f"dict({items})"
    else:
        return None
    return text if len(text) <= _MAX_LITERAL else "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _source(target: Any) -> str | None:
    """The definition's code without its decorators (they declare the Function; they are not its
    code), normalized by `ast.unparse` so comments and formatting do not count."""
    try:
        text = textwrap.dedent(inspect.getsource(target))
    except (OSError, TypeError):
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))), None)
    if node is None:
        return text
    node.decorator_list = []
    return ast.unparse(node)


def _referenced_names(source: str) -> dict[str, set[str]]:
    """Global names the source loads, each with the attribute names read from it (`mod.attr`)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    bound = {node.arg for node in ast.walk(tree) if isinstance(node, ast.arg)}
    names: dict[str, set[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id not in bound:
            names.setdefault(node.value.id, set()).add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in bound:
            names.setdefault(node.id, set())
    return names


class _Walk:
    def __init__(self, roots: frozenset[str]) -> None:
        self.parts: list[str] = []
        self.seen: set[int] = set()
        self.roots = roots

    def definition(self, target: Any) -> None:
        """A function or class of the project: its source, then what it references."""
        if id(target) in self.seen:
            return
        self.seen.add(id(target))
        source = _source(target)
        if source is None:  # defined where no source is kept (an interactive session): its name only
            self.parts.append(f"nosource {getattr(target, '__qualname__', repr(target))}")
            return
        self.parts.append(f"source {target.__module__}.{target.__qualname__}\n{source}")
        namespace = vars(sys.modules[target.__module__]) if target.__module__ in sys.modules else {}
        if inspect.isfunction(target):
            namespace = {**namespace, **target.__globals__}
            closure = inspect.getclosurevars(target).nonlocals
            namespace.update(closure)
        for name, attributes in sorted(_referenced_names(source).items()):
            if name in namespace:
                self.value(f"{target.__qualname__}:{name}", namespace[name], attributes)

    def value(self, label: str, value: Any, attributes: set[str] = frozenset()) -> None:
        if isinstance(value, types.ModuleType):
            if _is_project_module(value.__name__, self.roots):
                for attribute in sorted(attributes):
                    if hasattr(value, attribute):
                        self.value(f"{label}.{attribute}", getattr(value, attribute))
            else:
                self.parts.append(f"{label} = module {value.__name__}")
            return
        if (inspect.isfunction(value) or inspect.isclass(value)) and _is_project_module(value.__module__, self.roots):
            self.parts.append(f"{label} = definition")
            self.definition(value)
            return
        literal = _literal(value)
        if literal is not None:
            self.parts.append(f"{label} = {literal}")
            return
        where = getattr(value, "__module__", None) or type(value).__module__
        name = getattr(value, "__qualname__", None) or type(value).__qualname__
        self.parts.append(f"{label} = {where}.{name}")


def code_digest(target: Any) -> str:
    """A digest of a function's or class's code and of the project code and constants it references.

    >>> def helper(x): return x + OFFSET
    >>> def f(x): return helper(x)
    >>> OFFSET = 1; before = code_digest(f)
    >>> OFFSET = 2; before == code_digest(f)
    False
    """
    module = getattr(target, "__module__", None) or ""
    walk = _Walk(frozenset({module.partition(".")[0]}) - {"", "__main__"})
    walk.definition(target)
    return "sha256:" + hashlib.sha256("\n\n".join(walk.parts).encode()).hexdigest()
