"""The README's Layout names every module of the two packages, so a new module cannot go unmentioned."""

from __future__ import annotations

import re
from pathlib import Path

from ..conftest import REPO


def test_the_readme_layout_names_every_module():
    readme = (REPO / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    missing = [str(path.relative_to(REPO)) for package in ("gpufn_dagster", "devcluster/gpufn_devcluster")
               for path in sorted((REPO / package).rglob("*.py"))
               if path.name != "__init__.py" and not re.search(rf"(?<![\w/]){re.escape(path.name)}\b", layout)]
    assert not missing, f"modules missing from the README's Layout: {', '.join(missing)}"


def test_only_one_module_imports_dagsters_private_modules():
    """`dagster._…` names move between releases: one module holds them, each with its reason."""
    import ast

    importers = {}
    for path in sorted((REPO / "gpufn_dagster").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n.startswith("dagster._") for n in names):
                importers.setdefault(path.relative_to(REPO).as_posix(), []).append(node.lineno)
    assert set(importers) == {"gpufn_dagster/dagster_private.py"}, importers
    text = (REPO / "gpufn_dagster" / "dagster_private.py").read_text()
    # each import follows a comment saying why
    lines = text.splitlines()
    unexplained = [line for i, line in enumerate(lines) if line.startswith("from dagster._")
                   and not lines[i - 1].startswith(("#", "from dagster._"))]
    assert unexplained == [], unexplained


def test_test_modules_share_helpers_through_helpers_modules_only():
    """A test module imports what tests share from a helpers module, never from another test module."""
    import ast

    crossing = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("tests.")) \
                    and (node.module or "").split(".")[-1].startswith("test_"):
                crossing.append(f"{path.relative_to(REPO)}:{node.lineno} imports {node.module}")
    assert crossing == [], crossing


def test_the_runtime_wheel_ships_the_runtime_package_only(tmp_path):
    """`pip install gpufn-dagster` gets gpufn_dagster and nothing of the test harness: the wheel built
    from this checkout's pyproject holds no gpufn_devcluster module, no test and no example, and the
    harness builds as a distribution of its own that carries its `gpufn-devcluster` command."""
    import shutil
    import subprocess
    import sys
    import zipfile

    def build(project: Path) -> list[str]:
        out = tmp_path / f"wheels-{project.name}"
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                        "-w", str(out), str(project)], check=True, capture_output=True, timeout=600)
        (wheel,) = out.glob("*.whl")
        return zipfile.ZipFile(wheel).namelist()

    # a copy, so that building leaves no build/ or egg-info in the checkout
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, runtime / name)
    for name in ("gpufn_dagster", "devcluster", "tests", "docs_pipeline"):
        shutil.copytree(REPO / name, runtime / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    names = build(runtime)
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith((".dist-info", ".data"))}
    assert tops == {"gpufn_dagster"}, tops
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "gpufn-devcluster" not in zipfile.Path(next((tmp_path / "wheels-runtime").glob("*.whl")), entry_points).read_text()

    harness = build(runtime / "devcluster")
    assert "gpufn_devcluster/cluster.py" in harness and "gpufn_devcluster/stages.yaml" in harness
    assert not [n for n in harness if n.startswith("gpufn_dagster/")]
