"""Unit layer: the `gpufn` command answers at once and finds the instance the README's `dagster dev` uses."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ..conftest import REPO

GPUFN = [sys.executable, "-m", "gpufn_dagster.cli"]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DAGSTER_HOME"}
    return subprocess.run([*GPUFN, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_help_does_not_import_dagster_or_lancedb(tmp_path: Path):
    """Why `gpufn --help` (and `gpufn classes`) answer at once: neither loads Dagster or Lance, which
    take seconds to import. Asserted on what gets imported, not on a time."""
    code = ("import sys\nfrom gpufn_dagster.cli import main\n"
            "for args in (['--help'], ['classes', '--dir', sys.argv[1]]):\n"
            "    try:\n        main(args)\n    except SystemExit as done:\n        assert done.code in (0, None), done.code\n"
            "print(sorted(m for m in ('dagster', 'lancedb', 'lance') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "classes")], capture_output=True, text=True,
                         check=True, cwd=tmp_path)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout + out.stderr
    assert "Usage: " in out.stdout and "a100-80gb" in out.stdout
    assert run(["--help"], tmp_path).returncode == 0


def test_capacity_finds_the_project_home_or_says_what_to_do(tmp_path: Path):
    lost = run(["capacity"], tmp_path)
    assert lost.returncode == 1 and "Traceback" not in lost.stderr
    assert "no Dagster instance here: set DAGSTER_HOME" in lost.stderr and len(lost.stderr.strip().splitlines()) == 1
    (tmp_path / ".dagster_home").mkdir()
    shutil.copy(REPO / "deploy" / "dagster-embedded.yaml", tmp_path / ".dagster_home" / "dagster.yaml")
    shutil.copytree(REPO / "classes", tmp_path / "classes")
    found = run(["capacity", "--json"], tmp_path)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {}


def test_refresh_state_says_what_is_missing_and_writes_a_modules_state(tmp_path: Path):
    """`gpufn refresh-state` on a code location with no schemas_state names the file and what to pass;
    with neither -f nor -m it says to name one; `-m` writes the module's state file."""
    (tmp_path / "plain_defs.py").write_text("import dagster as dg\ndefs = dg.Definitions()\n")
    done = run(["refresh-state", "-f", "plain_defs.py"], tmp_path)
    assert done.returncode == 1 and "plain_defs.py: no build_definitions(schemas_state=...) ran" in done.stderr
    done = run(["refresh-state"], tmp_path)
    assert done.returncode == 2 and "one of -f FILE or -m MODULE" in done.stderr
    (tmp_path / "stated_defs.py").write_text(
        "import lancedb, pyarrow as pa\nfrom gpufn_dagster import build_definitions, gpu_function\n"
        "lancedb.connect('db').create_table('docs', pa.table({'text': ['a']}), exist_ok=True)\n"
        "def upper(text: str) -> str:\n    return text.upper()\n"
        "defs = build_definitions(assets=[gpu_function(table='docs', column='loud')(upper)], db_uri='db',"
        " schemas_state='state/schemas.json')\n")
    done = run(["refresh-state", "-m", "stated_defs"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads((tmp_path / "state" / "schemas.json").read_text())["db_uri"] == "db"
