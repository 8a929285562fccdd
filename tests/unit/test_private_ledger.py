"""The ledger of private reaches (`gpufn_dagster.private_ledger`): each reach is still where the pinned
libraries keep it, and no other module reaches into a library's private parts."""

from __future__ import annotations

import ast

import pytest

from gpufn_dagster.private_ledger import REACHES, _has, _source_says

from ..conftest import REPO


@pytest.mark.parametrize("reach", REACHES, ids=lambda r: f"{r.library}:{r.what.split(' ')[0]}")
def test_each_private_reach_is_where_the_pinned_library_keeps_it(reach):
    assert reach.check(), (f"{reach.library} changed under a private reach: {reach.what} (used by {reach.used_by}, "
                           f"because {reach.why}); find the public replacement or move the reach in "
                           "gpufn_dagster/private_ledger.py")


def test_a_check_fails_when_the_private_part_is_gone():
    assert _has("dagster_k8s.launcher:K8sRunLauncher", "_api_client")() is False  # an instance attribute, not a class one
    assert _has("multiprocessing.forkserver:ForkServer", "_stop")() is True
    assert _source_says("dagster._core.storage.sql:check_alembic_revision", "no such words")() is False


# Names of namedtuples' public API, which begin with an underscore so as not to clash with fields.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make"}


def test_no_module_but_the_ledger_reads_a_private_attribute_of_another_library():
    """An attribute `x._name` (or `getattr(x, "_name")`) whose name gpufn_dagster never defines is
    another library's private part: only the ledger reaches it."""
    trees = {path: ast.parse(path.read_text()) for path in sorted((REPO / "gpufn_dagster").rglob("*.py"))}
    own = set()
    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                own.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                own.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
                own.add(node.attr)
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                own.add(node.target.id)
    reaches = []
    for path, tree in trees.items():
        if path.name == "private_ledger.py":
            continue
        for node in ast.walk(tree):
            name = (node.attr if isinstance(node, ast.Attribute)
                    else node.args[1].value if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                    and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) > 1
                    and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str) else None)
            if name and name.startswith("_") and not name.startswith("__") and name not in own | NAMEDTUPLE_API:
                reaches.append(f"{path.relative_to(REPO)}:{node.lineno} {ast.unparse(node)}")
    assert reaches == [], f"private reaches outside gpufn_dagster/private_ledger.py: {reaches}"
