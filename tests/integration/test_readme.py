"""The README's Python snippets run as written, in order, in the checkout (with a fresh database)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

from gpufn_devcluster.processes import free_port

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


SEND = """
import pickle, sys
import dagster as dg
import readme_example
from gpufn_dagster import function_of
found = {function_of(v).name: pickle.dumps(function_of(v)) for v in vars(readme_example).values()
         if isinstance(v, dg.AssetsDefinition) and function_of(v) is not None}
pickle.dump(found, open(sys.argv[1], "wb"))
"""
RECEIVE = """
import json, pickle, sys
import pyarrow as pa
sent = pickle.load(open(sys.argv[1], "rb"))
functions = {name: pickle.loads(data) for name, data in sent.items()}  # a fresh process: by where each is defined
embed = functions["docs__embedding"].open()
vectors = embed(text=pa.array(["a short document", "another one"]))
counts = functions["docs__word_count"].open()(text="three words here")
print(json.dumps([sorted(functions), len(vectors), len(vectors[0]), counts]))
"""


def test_every_function_the_readme_declares_can_be_sent_to_another_process_and_computes_there(tmp_path):
    """What keeps a Function warm (its slot's own process) works for every form the README writes:
    each Function its blocks declare -- `@gpu_function` on a class and on a def, `gpu_function(...)(f)`
    of a `lancedb.udf` -- is sent by where it is defined, and a fresh process that imports the
    README's code computes with it (the example's MiniLM embedder among them)."""
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), re.S)
    (tmp_path / "readme_example.py").write_text("\n".join(blocks))
    env = {**os.environ, "GPUFN_LANCEDB_URI": str(tmp_path / "lancedb"), "PYTHONPATH": f"{tmp_path}:{REPO}"}
    sent = tmp_path / "sent.pickle"
    for script in (SEND, RECEIVE):
        done = subprocess.run([sys.executable, "-c", script, str(sent)], cwd=REPO, capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    names, rows, width, words = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"docs__embedding", "docs__word_count", "docs__n_chars", "docs__vector", "docs__loud"} <= set(names)
    assert (rows, width, words) == (2, 384, 3)


def _marked(mark: str) -> list[int]:
    """The pids of live processes whose environment carries `mark` (children inherit it)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if mark.encode() in (entry / "environ").read_bytes():
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def test_the_readmes_background_dagster_dev_stops_with_kill_even_from_a_backgrounded_script(tmp_path):
    """The README's way to run the example in the background, run as a background job of a script
    runs it (SIGINT ignored on entry, which `trap - INT` cannot undo): `kill $(cat dagster-dev.pid)`
    stops dagster dev and every server it started."""
    (block,) = [b for b in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S)
                if "dagster-dev.pid" in b]
    port = free_port()
    start_line = block.splitlines()[0].replace("-w workspace.yaml", f"-w workspace.yaml -p {port}")
    assert start_line != block.splitlines()[0]
    (tmp_path / ".venv").symlink_to(REPO / ".venv")
    (tmp_path / "workspace.yaml").write_text(
        f"load_from:\n  - python_file:\n      relative_path: {REPO / 'definitions.py'}\n"
        f"      working_directory: {REPO}\n      location_name: gpufn_example\n")
    home = tmp_path / ".dagster_home"
    home.mkdir()
    shutil.copy(REPO / "deploy" / "dagster-embedded.yaml", home / "dagster.yaml")
    mark = f"GPUFN_README_TEST={uuid.uuid4().hex}"
    env = {**os.environ, mark.split("=")[0]: mark.split("=")[1], "GPUFN_LANCEDB_URI": str(tmp_path / "lancedb"),
           "GPUFN_CLASSES_DIR": str(REPO / "classes")}
    script = "\n".join([start_line, *block.splitlines()[1:]])
    shell = subprocess.Popen(["bash", "-c", script], cwd=tmp_path, env=env, start_new_session=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        assert shell.wait(timeout=60) == 0
        deadline = time.monotonic() + 240  # a loaded 2-core machine starts dagster dev slowly
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/server_info", timeout=5).read()
                break
            except OSError:
                assert time.monotonic() < deadline, (tmp_path / "dagster-dev.log").read_text()[-3000:]
                time.sleep(1)
        assert len(_marked(mark)) >= 3  # dagster dev, its webserver, daemon and code server
        subprocess.run(["bash", "-c", "kill $(cat dagster-dev.pid)"], cwd=tmp_path, check=True)
        deadline = time.monotonic() + 90
        while _marked(mark) and time.monotonic() < deadline:
            time.sleep(1)
        assert _marked(mark) == [], "dagster dev outlived `kill $(cat dagster-dev.pid)`"
    finally:
        for pid in _marked(mark):
            os.kill(pid, signal.SIGKILL)
