"""GPU classes: the shipped ones load and list the same from Python, the CLI and HTTP; bad files are
rejected whole, with the file, class and field named."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

from gpufn_dagster import GpuClassError, list_gpu_classes, load_gpu_classes
from gpufn_dagster.class_files import cached_gpu_classes

from ..conftest import CLASSES
from ..helpers import gpufn_serve

GPUFN = [sys.executable, "-m", "gpufn_dagster.cli"]


def test_shipped_classes_describe_real_pools():
    classes = {c.name: c for c in list_gpu_classes(CLASSES)}
    assert set(classes) == {"default", "a100-80gb", "h100-80gb", "l4", "a100-mig-1g-10gb"}
    a100 = classes["a100-80gb"]
    assert (a100.resource_name, a100.gpu_memory_bytes, a100.max_gpu_count_per_worker) == (
        "nvidia.com/gpu", 80 * 2**30, 8)
    assert a100.node_selector["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"
    assert classes["h100-80gb"].node_selector["karpenter.k8s.aws/instance-gpu-name"] == "h100"
    assert classes["l4"].node_selector["cloud.google.com/gke-accelerator"] == "nvidia-l4"
    assert classes["a100-mig-1g-10gb"].resource_name == "nvidia.com/mig-1g.10gb"
    assert classes["h100-80gb"].max_wait.total_seconds() == 7200
    for c in classes.values():
        assert any(t.effect == "NoSchedule" for t in c.tolerations), c.name


def write(directory: Path, file_stem: str, **fields) -> Path:
    path = directory / f"{file_stem}.yaml"
    path.write_text(yaml.safe_dump({"name": file_stem, "gpu_model": "X", "gpu_memory": "8GiB",
                                    "max_gpu_count_per_worker": 1, **fields}))
    return path


@pytest.mark.parametrize(("fields", "field", "words"), [
    ({"gpu_memory": "-8GiB"}, "gpu_memory", "must not be negative"),
    ({"gpu_memory": 0}, "gpu_memory", "greater than 0"),
    ({"colour": "blue"}, "colour", "unknown field; fields: name, resource_name"),
    ({"gpu_memroy": "8GiB"}, "gpu_memroy", "unknown field (did you mean 'gpu_memory'?)"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "efect": "NoSchedule"}]}, "tolerations[0].efect",
     "unknown field (did you mean 'effect'?); fields: key, operator, value, effect"),
    ({"local": {"slot": 2}}, "local.slot", "unknown field (did you mean 'slots'?)"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "effect": "NoScheduel"}]}, "tolerations[0].effect",
     "NoSchedule"),
    ({"max_gpu_count_per_worker": 0}, "max_gpu_count_per_worker", "greater than or equal to 1"),
    ({"resource_name": "nvidia.com/gpu count"}, "resource_name", "extended resource name"),
    ({"max_wait": "-5m"}, "max_wait", "positive"),
    ({"local": {"warm": {"idle": "-1m"}}}, "local.warm.idle", "must not be negative (0 keeps no instance)"),
    ({"local": {"warm": {"instances": 0}}}, "local.warm.instances", "greater than or equal to 1"),
    ({"local": {"warm": {"memory": "lots"}}}, "local.warm.memory", "not a byte size"),
    ({"local": {"warm": {"idel": "5m"}}}, "local.warm.idel", "unknown field (did you mean 'idle'?)"),
])
def test_bad_field_is_named_with_file_and_class(classes_dir, fields, field, words):
    path = write(classes_dir, "broken", **fields)
    with pytest.raises(GpuClassError) as err:
        load_gpu_classes(classes_dir)
    message = str(err.value)
    assert f"{path}: class 'broken': field '{field}'" in message
    assert words in message


def test_duplicate_name_and_missing_default_are_rejected(classes_dir):
    write(classes_dir, "l4-copy", name="l4")
    with pytest.raises(GpuClassError, match=r"class 'l4': field 'name': duplicate, also defined in") as err:
        load_gpu_classes(classes_dir)
    assert "l4-copy.yaml" in str(err.value) and "/l4.yaml" in str(err.value)
    (classes_dir / "l4-copy.yaml").unlink()
    (classes_dir / "default.yaml").unlink()
    with pytest.raises(GpuClassError, match="no class named 'default'"):
        load_gpu_classes(classes_dir)


def test_one_bad_file_loads_nothing(classes_dir):
    good = {c.name for c in list_gpu_classes(classes_dir)}
    (classes_dir / "zz.yaml").write_text("name: [unclosed")
    for load in (list_gpu_classes, load_gpu_classes, cached_gpu_classes):
        with pytest.raises(GpuClassError, match=r"zz.yaml: not valid YAML") as err:
            load(classes_dir)
        problems = [line for line in str(err.value).splitlines() if line.startswith(f"  {classes_dir}")]
        assert len(problems) == 1 and "zz.yaml" in problems[0]   # one problem: the bad file; the others are fine
    (classes_dir / "zz.yaml").unlink()
    assert {c.name for c in list_gpu_classes(classes_dir)} == good and len(good) == 5


def test_cli_lists_classes_as_table_and_json():
    table = subprocess.run([*GPUFN, "classes", "--dir", str(CLASSES)], capture_output=True, text=True, check=True)
    assert "a100-mig-1g-10gb" in table.stdout and "80GiB" in table.stdout
    listed = json.loads(subprocess.run([*GPUFN, "classes", "--dir", str(CLASSES), "--json"],
                                       capture_output=True, text=True, check=True).stdout)
    assert [c["name"] for c in listed] == [c.name for c in list_gpu_classes(CLASSES)]
    assert {"name", "resource_name", "gpu_model", "gpu_memory_bytes", "max_gpu_count_per_worker"} <= set(listed[0])


def test_cli_reports_bad_classes_without_traceback(classes_dir):
    write(classes_dir, "broken", gpu_memory="lots")
    done = subprocess.run([*GPUFN, "classes", "--dir", str(classes_dir)], capture_output=True, text=True)
    assert done.returncode == 2
    assert "broken.yaml: class 'broken': field 'gpu_memory'" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.fixture
def api_server():
    with gpufn_serve(CLASSES, "s3cret") as base:
        yield f"{base}/v1/gpu/classes"


def test_http_api_lists_classes_with_bearer_token(api_server):
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(api_server, timeout=5)
    assert err.value.code == 401
    request = urllib.request.Request(api_server, headers={"Authorization": "Bearer s3cret"})
    body = json.loads(urllib.request.urlopen(request, timeout=5).read())
    by_name = {c["name"]: c for c in body["classes"]}
    assert by_name["h100-80gb"]["gpu_memory_bytes"] == 80 * 2**30
    assert by_name["default"]["max_gpu_count_per_worker"] == 1
