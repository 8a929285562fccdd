"""The README's Layout names every module of the two packages, so a new module cannot go unmentioned."""

from __future__ import annotations

import re

from ..conftest import REPO


def test_the_readme_layout_names_every_module():
    readme = (REPO / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    missing = [str(path.relative_to(REPO)) for package in ("gpufn_dagster", "gpufn_devcluster")
               for path in sorted((REPO / package).rglob("*.py"))
               if path.name != "__init__.py" and not re.search(rf"(?<![\w/]){re.escape(path.name)}\b", layout)]
    assert not missing, f"modules missing from the README's Layout: {', '.join(missing)}"
