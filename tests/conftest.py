"""Shared fixtures: the shipped GPU classes, a fresh LanceDB directory per test, and (for tests
marked `k8s`) one real control plane per session with fake node pools built from classes/."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CLASSES = REPO / "classes"
os.environ["GPUFN_CLASSES_DIR"] = str(CLASSES)


@pytest.fixture
def classes_dir(tmp_path: Path) -> Path:
    """A writable copy of the shipped classes, for tests that add or break one."""
    target = tmp_path / "classes"
    shutil.copytree(CLASSES, target)
    return target


@pytest.fixture
def db_uri(tmp_path: Path) -> str:
    return str(tmp_path / "lancedb")


NODES_PER_CLASS = 2
CPU_NODES = 2


@pytest.fixture(scope="session")
def cluster() -> Iterator:
    """The real control plane (etcd, apiserver, controller-manager, scheduler, KWOK), once per session."""
    from gpufn_dagster.classes import list_gpu_classes
    from gpufn_dagster.devcluster.cluster import DevCluster, binaries_dir

    with DevCluster(binaries_dir()) as running:
        running.add_pools(list_gpu_classes(CLASSES), nodes_per_class=NODES_PER_CLASS, cpu=CPU_NODES)
        yield running
