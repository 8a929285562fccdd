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

The same code gives the same digest in every process -- the code server, the run worker, a step
pod on a CPU node and a shard pod on a GPU node, `python file.py` and `python -m package.module`
-- because nothing it counts depends on the process:

- a module-level name counts by the source text that binds it (`DEVICE = "cuda" if
  torch.cuda.is_available() else "cpu"` by that expression, `X = os.environ.get("X")` likewise; a
  literal by its value), never by the value it happens to hold in this process; only a name no
  source binds (set by `exec`, a doctest, an interactive session) counts by its value when that is
  a literal;
- a definition is named by its file relative to the project root (the first directory above it
  that is not a package) and its qualified name, never by its module's import name (`__main__`
  when run as a script).

Every parse this package causes runs under one process-wide lock (`parse`, `getsource`,
`getsourcelines`, `signature`, `format_exc`; the digest's walk holds it throughout): CPython
3.11 keeps the AST builder's recursion depth in one counter per interpreter, so two threads
turning source into `ast` objects at once -- one switched out mid-way by a finalizer, the other
starting at another stack depth -- fail with `SystemError: AST constructor recursion depth
mismatch` (seen at definition load). Parses hide inside the standard library too: `inspect.getsource` and
`getsourcelines` parse the whole file of a class (`inspect.findsource`), `inspect.signature` a
builtin's text signature, and formatting a traceback each frame's line (to underline its
expression). So the package calls `ast.parse`, `inspect.getsource`/`getsourcelines`/`signature`
and `traceback.format_*` only through these helpers.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.metadata
import inspect
import os
import sys
import sysconfig
import textwrap
import threading
import time
import traceback
import types
from pathlib import Path
from collections.abc import Callable
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


_PARSE = threading.RLock()  # every parse of the process that this package causes (module docstring)
_RACE = "AST constructor recursion depth mismatch"  # CPython 3.11: another thread's parse interleaved


def _parsing(call: Callable[[], Any]) -> Any:
    """`call()` (something that parses) under the package's parse lock, so no two of the package's
    parses interleave; called again, a few times, when CPython 3.11 says a parse of another thread
    (one the package does not cause: Dagster's, a library's) interleaved with it -- its interpreter-wide
    counter then mismatches, and the same parse alone succeeds."""
    with _PARSE:
        for attempt in range(4):
            try:
                return call()
            except SystemError as err:
                if _RACE not in str(err) or attempt == 3:
                    raise
                time.sleep(0.001 * (attempt + 1))


def parse(source: str) -> ast.Module:
    """`ast.parse` under the package's parse lock."""
    return _parsing(lambda: ast.parse(source))


def getsource(target: Any) -> str:
    """`inspect.getsource` under the parse lock (it parses the whole file of a class)."""
    return _parsing(lambda: inspect.getsource(target))


def getsourcelines(target: Any) -> tuple[list[str], int]:
    """`inspect.getsourcelines` under the parse lock (it parses the whole file of a class)."""
    return _parsing(lambda: inspect.getsourcelines(target))


def signature(target: Any) -> inspect.Signature:
    """`inspect.signature` under the parse lock (it parses a builtin's `__text_signature__`, e.g.
    the `object.__init__` of a class Function without an `__init__` of its own)."""
    return _parsing(lambda: inspect.signature(target))


def format_exc() -> str:
    """`traceback.format_exc` under the parse lock (Python 3.11 parses each frame's line to
    underline the failing expression)."""
    return _parsing(traceback.format_exc)


def format_exception(err: BaseException) -> str:
    """`traceback.format_exception` of `err`, joined, under the parse lock (as `format_exc`)."""
    return _parsing(lambda: "".join(traceback.format_exception(err)))


def _project_file(path: str | None) -> tuple[str, str | None]:
    """(the file relative to the project root, the top-level package it is in): the root is the first
    directory above the file that is not a package, the same however the module was imported.

    >>> _project_file(__file__)[0], _project_file(__file__)[1]
    ('gpufn_dagster/function_spec/code_version.py', 'gpufn_dagster')
    """
    if not path:
        return "", None
    file = Path(path).resolve()
    top, directory = None, file.parent
    while (directory / "__init__.py").exists() and directory.parent != directory:
        top, directory = directory.name, directory.parent
    return file.relative_to(directory).as_posix(), top


def _module_file(module_name: str | None, target: Any = None) -> str | None:
    """The source file of a module (or of the module `target` was defined in, loaded or not)."""
    found = getattr(sys.modules.get(module_name or ""), "__file__", None)
    if found is None and target is not None:
        found = getattr(target, "__globals__", {}).get("__file__") or _source_file(target)
    return found


def _source_file(target: Any) -> str | None:
    try:
        return inspect.getsourcefile(target)
    except TypeError:
        return None


def _where(module_name: str | None, target: Any = None) -> str:
    """How a definition's module is named in the digest: its project file, else (a library) its name."""
    relative, _ = _project_file(_module_file(module_name, target))
    return relative or str(module_name)


@functools.lru_cache(maxsize=512)
def _bindings(path: str, stamp: tuple[int, int]) -> dict[str, tuple[Any, ...]]:
    """The module-level bindings of a source file: name -> what binds it, in order: ("text", source
    text of the value, or the literal's value) or ("import", module, name). Statements under
    top-level `if`/`try`/`with` count; function and class bodies do not."""
    try:
        tree = parse(Path(path).read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return {}
    out: dict[str, list[tuple[str, str]]] = {}

    def bind(name: str, how: tuple[str, ...]) -> None:
        out.setdefault(name, []).append(how)

    def text(node: ast.expr) -> str:
        try:
            literal = _literal(ast.literal_eval(node))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            literal = None
        return literal if literal is not None else ast.unparse(node)

    def visit(statements: list[ast.stmt]) -> None:
        for node in statements:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    for name in (n.id for n in ast.walk(target) if isinstance(n, ast.Name)):
                        bind(name, ("text", text(node.value)))
            elif isinstance(node, (ast.AnnAssign, ast.AugAssign)) and isinstance(node.target, ast.Name) \
                    and node.value is not None:
                op = "" if isinstance(node, ast.AnnAssign) else type(node.op).__name__ + "="
                bind(node.target.id, ("text", op + text(node.value)))
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    bind(alias.asname or alias.name, ("import", node.module, alias.name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                for block in ("body", "orelse", "finalbody"):
                    visit(getattr(node, block, []) or [])
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)
    visit(tree.body)
    return {name: tuple(hows) for name, hows in out.items()}


def _stamp(path: str) -> tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (0, -1)
    return (stat.st_mtime_ns, stat.st_size)


def _bound_in_source(module_name: str | None, name: str, depth: int = 0, path: str | None = None) -> str | None:
    """The source text that binds `name` at the top of `module_name` (its file `path` when known;
    following `from x import name` into project modules), or None when no source binds it."""
    path = path or _module_file(module_name)
    if not path or not path.endswith(".py") or depth > 8:
        return None
    hows = _bindings(path, _stamp(path)).get(name)
    if not hows:
        return None
    texts = []
    for how in hows:
        if how[0] == "import":
            inner = _bound_in_source(how[1], how[2], depth + 1) if _is_project_module(how[1]) else None
            texts.append(inner if inner is not None else f"from {how[1]} import {how[2]}")
        else:
            texts.append(how[1])
    return " ; ".join(texts)


def _source(target: Any) -> str | None:
    """The definition's code without its decorators (they declare the Function; they are not its
    code), normalized by `ast.unparse` so comments and formatting do not count."""
    try:
        text = textwrap.dedent(getsource(target))
    except (OSError, TypeError):
        return None
    try:
        tree = parse(text)
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
        tree = parse(source)
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
        self.files: dict[str, str | None] = {}  # module -> its source file, for the definitions walked

    def definition(self, target: Any) -> None:
        """A function or class of the project: its source, then what it references."""
        if id(target) in self.seen:
            return
        self.seen.add(id(target))
        source = _source(target)
        if source is None:  # defined where no source is kept (an interactive session): its name only
            self.parts.append(f"nosource {getattr(target, '__qualname__', repr(target))}")
            return
        self.parts.append(f"source {_where(target.__module__, target)}:{target.__qualname__}\n{source}")
        self.files[target.__module__] = _module_file(target.__module__, target)
        namespace = vars(sys.modules[target.__module__]) if target.__module__ in sys.modules else {}
        closure: dict[str, Any] = {}
        if inspect.isfunction(target):
            namespace = {**namespace, **target.__globals__}
            closure = inspect.getclosurevars(target).nonlocals
            namespace.update(closure)
        for name, attributes in sorted(_referenced_names(source).items()):
            if name in namespace:
                module = None if name in closure else target.__module__
                self.value(f"{target.__qualname__}:{name}", namespace[name], attributes, module=module, name=name)

    def value(self, label: str, value: Any, attributes: set[str] = frozenset(), module: str | None = None,
              name: str | None = None) -> None:
        """One referenced value. A module-level name of `module` that is not a definition or a
        module counts by the source that binds it, not by what it holds in this process."""
        if isinstance(value, types.ModuleType):
            if _is_project_module(value.__name__, self.roots):
                self.parts.append(f"{label} = module {_where(value.__name__)}")
                for attribute in sorted(attributes):
                    if hasattr(value, attribute):
                        self.value(f"{label}.{attribute}", getattr(value, attribute), module=value.__name__,
                                   name=attribute)
            else:
                self.parts.append(f"{label} = module {value.__name__}")
            return
        if (inspect.isfunction(value) or inspect.isclass(value)) and _is_project_module(value.__module__, self.roots):
            self.parts.append(f"{label} = definition")
            self.definition(value)
            return
        bound = _bound_in_source(module, name, path=self.files.get(module)) if module is not None \
            and name is not None and (module in self.files or _is_project_module(module, self.roots)) else None
        if bound is not None:
            self.parts.append(f"{label} = source {bound}")
            return
        literal = _literal(value)
        if literal is not None:
            self.parts.append(f"{label} = {literal}")
            return
        where = getattr(value, "__module__", None) or type(value).__module__
        qualname = getattr(value, "__qualname__", None) or type(value).__qualname__
        self.parts.append(f"{label} = {_where(where) if _is_project_module(where, self.roots) else where}.{qualname}")


def code_digest(target: Any) -> str:
    """A digest of a function's or class's code and of the project code and constants it references.

    >>> def helper(x): return x + OFFSET
    >>> def f(x): return helper(x)
    >>> OFFSET = 1; before = code_digest(f)
    >>> OFFSET = 2; before == code_digest(f)
    False
    """
    module = getattr(target, "__module__", None) or ""
    _, top = _project_file(_module_file(module, target))
    roots = frozenset({module.partition(".")[0], top or ""}) - {"", "__main__"}
    with _PARSE:
        walk = _Walk(roots)
        walk.definition(target)
    return "sha256:" + hashlib.sha256("\n\n".join(walk.parts).encode()).hexdigest()
