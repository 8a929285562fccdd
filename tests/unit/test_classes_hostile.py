"""Hostile class files: every one is a clear error naming the file (and class and field where it has
them) or a class that loads -- never a traceback, never a hang -- from the loader, the CLI and the
HTTP API alike. A fuzz with a fixed seed mutates one field of a valid class at a time, plus whole
files no editor should produce (alias bombs, deep nesting, non-UTF-8 bytes, directories, dangling
links, lock files)."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import time

import pytest
from starlette.testclient import TestClient

from gpufn_dagster import GpuClassError, load_gpu_classes
from gpufn_dagster.api import create_app
from gpufn_dagster.errors import ApiConfigError

from ..conftest import CLASSES
from ..helpers import BASE, SEED, field_cases, outcome, place, whole_file_cases

def test_fuzzed_class_files_give_clear_errors_and_never_hang(tmp_path):
    rng = random.Random(SEED)
    cases = {f"field case {i}": text for i, text in enumerate(field_cases(rng))} | whole_file_cases()
    tally: dict[str, int] = {}
    slowest = 0.0
    for i, (label, content) in enumerate(cases.items()):
        directory = tmp_path / f"case{i}"
        shutil.copytree(CLASSES, directory)
        place(directory, label, content)
        result, seconds = outcome(directory)
        slowest = max(slowest, seconds)
        assert result in ("valid", "error"), (label, content if not isinstance(content, str) else content[:300],
                                              result)
        assert seconds < 20, (label, seconds)  # generous: a hang is minutes
        tally[result] = tally.get(result, 0) + 1
    print(f"\n{len(cases)} class files: {tally.get('error', 0)} clear errors, {tally.get('valid', 0)} loaded, "
          f"0 tracebacks, 0 hangs; slowest {slowest:.2f}s")
    assert tally["error"] > 200 and tally.get("valid", 0) > 0


@pytest.mark.parametrize(("label", "words"), [
    ("alias bomb in name", "not valid YAML: more than 64 aliases"),
    ("nested 1000 deep", "not valid YAML: nested deeper than 32 levels"),
    ("non-UTF-8 bytes", "not UTF-8 text (byte 0xff at offset 22)"),
    ("a huge file", "200,011 bytes; a class file may hold at most 65,536"),
    ("a directory", "not a readable file"),
    ("a dangling symlink", "not a readable file"),
])
def test_whole_file_problems_are_named(tmp_path, label, words):
    shutil.copytree(CLASSES, tmp_path / "c")
    path = place(tmp_path / "c", label, whole_file_cases()[label])
    with pytest.raises(GpuClassError) as err:
        load_gpu_classes(tmp_path / "c")
    assert f"{path}: {words}" in str(err.value)


@pytest.mark.parametrize(("field", "value", "words"), [
    ("gpu_memory", "9" * 5000, "class 'fuzz': field 'gpu_memory': an integer of 5,000 digits, larger than any value"),
    ("tolerations", "[{key: k, operator: Exists, effect: NoExecute, toleration_seconds: " + "9" * 5000 + "}]",
     "field 'tolerations[0].toleration_seconds': an integer of 5,000 digits"),
    ("max_wait", "99999999999999d", "longer than a duration can be"),
    ("price_per_gpu_hour", ".inf", "finite number"),
    ("gpu_memory", "1e999999999999", "gpu_memory"),
    ("tolerations", '[{key: k, operator: Exists, effect: NoExecute, toleration_seconds: 9223372036854775808}]',
     "tolerations[0].toleration_seconds"),
])
def test_out_of_range_numbers_are_refused_at_load(tmp_path, field, value, words):
    shutil.copytree(CLASSES, tmp_path / "c")
    lines = [f"{k}: {json.dumps(v)}" for k, v in BASE.items() if k != field]
    (tmp_path / "c" / "fuzz.yaml").write_text("\n".join([*lines, f"{field}: {value}"]) + "\n")
    with pytest.raises(GpuClassError, match="fuzz.yaml") as err:
        load_gpu_classes(tmp_path / "c")
    assert words in str(err.value)
    assert "sys." not in str(err.value)  # no advice about Python's internals


def test_an_editors_lock_file_is_not_a_class(tmp_path):
    shutil.copytree(CLASSES, tmp_path / "c")
    (tmp_path / "c" / ".#l4.yaml").symlink_to("root@host.1234:1700000000")  # what Emacs leaves
    (tmp_path / "c" / ".l4.yaml.swp").write_bytes(b"\x00\x01")
    assert "l4" in load_gpu_classes(tmp_path / "c")


def test_cli_and_api_report_hostile_files_as_clear_errors(tmp_path):
    shutil.copytree(CLASSES, tmp_path / "c")
    place(tmp_path / "c", "alias bomb in node_affinity", whole_file_cases()["alias bomb in node_affinity"])
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", "classes", "--dir", str(tmp_path / "c")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "fuzz.yaml: not valid YAML: more than 64 aliases" in done.stderr
    assert time.monotonic() - started < 60
    client = TestClient(create_app(str(tmp_path / "c"), token="t0ken"))
    response = client.get("/v1/gpu/classes", headers={"Authorization": "Bearer t0ken"})
    assert response.status_code == 500 and "more than 64 aliases" in response.json()["error"]


def test_an_empty_token_is_refused_as_configuration():
    with pytest.raises(ApiConfigError, match="empty"):
        create_app(str(CLASSES), token="")
    client = TestClient(create_app(str(CLASSES), token="s3cret"))
    assert client.get("/v1/gpu/classes", headers={"Authorization": "Bearer "}).status_code == 401
    done = subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", "serve", "--token", "", "--dir", str(CLASSES)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "the API token is empty" in done.stderr


def test_serving_a_public_address_without_a_token_needs_consent():
    done = subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", "serve", "--host", "0.0.0.0", "--dir",
                           str(CLASSES)], capture_output=True, text=True, timeout=60, env=_no_token_env())
    assert done.returncode == 2 and "not a loopback address and no token is set" in done.stderr


def _no_token_env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if k != "GPUFN_API_TOKEN"}


def test_the_api_answers_others_while_one_request_loads(tmp_path):
    """Loading runs off the event loop: a second client is answered while the first one's load is slow."""
    import threading

    import gpufn_dagster.api as api

    release = threading.Event()
    original = api.list_gpu_classes

    def slow_load(directory):
        release.wait(30)
        return original(directory)

    app = create_app(str(CLASSES), token="t")
    with TestClient(app) as client:
        api.list_gpu_classes = slow_load
        try:
            first = threading.Thread(target=lambda: client.get("/v1/gpu/classes",
                                                               headers={"Authorization": "Bearer t"}))
            first.start()
            time.sleep(0.2)
            started = time.monotonic()
            assert client.get("/v1/gpu/classes").status_code == 401
            assert time.monotonic() - started < 8
        finally:
            release.set()
            first.join(30)
            api.list_gpu_classes = original
