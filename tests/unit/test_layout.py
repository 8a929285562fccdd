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
    assert set(importers) == {"gpufn_dagster/private_ledger.py"}, importers
    text = (REPO / "gpufn_dagster" / "private_ledger.py").read_text()
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


# The folders of gpufn_dagster, by the name their docstrings use; modules directly in the package are
# its "top-level modules" (classes, tags, errors, ... that every folder may import).
FOLDERS = ("run", "run.k8s", "embedded", "refresh", "function_spec", "assets", "components")
TOP = "top-level modules"
# The rules of the two wings: each folder's docstring states them and its code keeps them.
NEVER = {"embedded": {"run.k8s", "kubernetes", "dagster_k8s"}, "run.k8s": {"embedded"},
         "refresh": {"embedded", "run.k8s"}, "run": {"embedded", "run.k8s", "kubernetes", "dagster_k8s"}}
WINGS = ("embedded", "run.k8s")


def _folder(module: str) -> str:
    """gpufn_dagster.run.k8s.watch -> run.k8s; gpufn_dagster.embedded.warm -> embedded; gpufn_dagster.tags -> top."""
    parts = module.split(".")[1:]
    if parts[:2] == ["run", "k8s"]:
        return "run.k8s"
    return parts[0] if len(parts) > 1 and parts[0] in FOLDERS else TOP


def _modules(folder: str) -> list[tuple[str, Path]]:
    base = REPO / "gpufn_dagster" / folder.replace(".", "/")
    paths = sorted(base.glob("*.py"))
    return [(".".join(("gpufn_dagster", folder, p.stem)) if p.stem != "__init__" else f"gpufn_dagster.{folder}", p)
            for p in paths]


def _imports(module: str, path: Path) -> list[tuple[int, str]]:
    """Every import of a module, lazy ones too, as absolute names."""
    import ast

    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or ""))
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
            found += ([(node.lineno, f"{base}.{node.module}")] if node.module
                      else [(node.lineno, f"{base}.{a.name}") for a in node.names])
    return found


def _rules(folder: str) -> tuple[set[str], set[str]]:
    """The `May import:` and `Never imports:` lines of a folder's docstring."""
    import ast

    doc = ast.get_docstring(ast.parse((REPO / "gpufn_dagster" / folder.replace(".", "/") / "__init__.py").read_text())) or ""
    lines = {line.split(":", 1)[0]: line.split(":", 1)[1] for line in doc.splitlines() if line.startswith(("May import:", "Never imports:"))}
    assert set(lines) == {"May import", "Never imports"}, f"{folder}/__init__.py states no import rules"
    may, never = ({name.strip().rstrip(".") for name in lines[key].split(",")} for key in ("May import", "Never imports"))
    assert doc.split("May import:")[0].strip(), f"{folder}/__init__.py does not say what it holds"
    return may, never


def test_each_folder_says_what_it_may_import_and_keeps_to_it():
    """The wings' rules hold in code, lazy imports included: `embedded` never imports `run.k8s` or
    `kubernetes`, `run.k8s` never `embedded`, the engine neither wing, the core no wing; and every
    other folder imports only the folders its docstring allows."""
    broken = []
    for folder in FOLDERS:
        may, never = _rules(folder)
        assert NEVER.get(folder, set()) <= never, f"{folder}/__init__.py drops a rule: {NEVER[folder] - never}"
        assert not may & never, (folder, may & never)
        for module, path in _modules(folder):
            for line, name in _imports(module, path):
                target = _folder(name) if name.startswith("gpufn_dagster.") else name.split(".")[0]
                if name.startswith("gpufn_dagster.") and target not in {folder, *may}:
                    broken.append(f"{path.relative_to(REPO)}:{line} imports {name} ({folder} may import {sorted(may)})")
                elif target in never:
                    broken.append(f"{path.relative_to(REPO)}:{line} imports {name} ({folder} never imports {target})")
    assert broken == [], "\n".join(broken)


def _named_modules(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every gpufn_dagster module a string of the file names."""
    import ast
    import re

    return [(node.lineno, name) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            for name in re.findall(r"gpufn_dagster(?:\.\w+)+", node.value)]


def test_no_module_string_names_a_module_of_a_wing_its_folder_may_not_import():
    """Modules named in strings (`python -m ...`, preload lists, mock targets) obey the same rules."""
    broken = []
    for folder in FOLDERS:
        may, _ = _rules(folder)
        for _, path in _modules(folder):
            broken += [f"{path.relative_to(REPO)}:{line} names {name}" for line, name in _named_modules(path)
                       if _folder(name) in WINGS and _folder(name) not in {folder, *may}]
    assert broken == [], broken


def test_the_wings_and_the_core_name_each_module_they_hold():
    import ast

    for folder in ("run", "run.k8s", "embedded"):
        doc = ast.get_docstring(ast.parse((REPO / "gpufn_dagster" / folder.replace(".", "/") / "__init__.py").read_text()))
        unnamed = [p.stem for _, p in _modules(folder) if p.stem != "__init__" and f"`{p.stem}`" not in doc]
        assert unnamed == [], f"{folder}/__init__.py does not name {unnamed}"


def test_the_rules_catch_a_wing_importing_the_other(tmp_path):
    """A test that cannot fail is a defect: the checks find an embedded module importing the
    Kubernetes wing lazily, and one naming it in a string."""
    module = REPO / "gpufn_dagster" / "embedded" / "slots.py"
    assert not [n for _, n in _imports("gpufn_dagster.embedded.slots", module) if _folder(n) == "run.k8s"]
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from ..run.k8s import watch\n    return 'gpufn_dagster.run.k8s.watch'\n")
    imported = _imports("gpufn_dagster.embedded.probe", probe)
    assert imported == [(2, "gpufn_dagster.run.k8s")] and _folder(imported[0][1]) in NEVER["embedded"]
    assert [(line, _folder(name)) for line, name in _named_modules(probe)] == [(3, "run.k8s")]
