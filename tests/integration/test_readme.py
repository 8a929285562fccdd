"""The README's Python snippets run as written, in order, in the checkout (with a fresh database)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from ..conftest import REPO


def test_readme_python_snippets_run_as_written(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    assert len(blocks) >= 3
    script = tmp_path / "readme_snippets.py"  # a file: lancedb.udf reads its function's source
    script.write_text("\n".join(blocks) + "\nprint(sorted(k.to_user_string() for k in "
                                          "defs.resolve_asset_graph().get_all_asset_keys()))\n")
    env = {**os.environ, "GPUFN_LANCEDB_URI": str(tmp_path / "lancedb"), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, str(script)], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines()[-1] == "['docs', 'docs__embedding', 'docs__word_count', 'docs_en']"
