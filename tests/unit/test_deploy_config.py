"""The shipped deployment files name what the launcher and the chart take: a typo in
deploy/helm/values.yaml or deploy/dagster-k8s.yaml fails here, not at an operator's install."""

from __future__ import annotations

import yaml
from dagster._config import process_config

from gpufn_dagster import GpuK8sRunLauncher

from ..conftest import REPO


def _valid(config: dict) -> list[str]:
    result = process_config(GpuK8sRunLauncher.config_type(), config)
    return [] if result.success else [error.message for error in result.errors]


def test_the_helm_values_give_the_custom_run_launcher_a_config_it_takes(monkeypatch):
    for name in ("DAGSTER_HOME", "DAGSTER_K8S_INSTANCE_CONFIG_MAP", "DAGSTER_K8S_PG_PASSWORD_SECRET"):
        monkeypatch.setenv(name, "set-by-the-chart")  # the chart sets them on the webserver and daemon
    values = yaml.safe_load((REPO / "deploy" / "helm" / "values.yaml").read_text())
    launcher = values["runLauncher"]
    assert launcher["type"] == "CustomRunLauncher"
    custom = launcher["config"]["customRunLauncher"]
    assert (custom["module"], custom["class"]) == ("gpufn_dagster", "GpuK8sRunLauncher")
    assert _valid(custom["config"]) == []
    assert values["dagsterDaemon"]["runMonitoring"]["startTimeoutSeconds"] == 0  # waits are bounded by max_wait
    assert values["postgresql"]["postgresqlScheme"] == "postgresql+psycopg2"


def test_the_instance_file_gives_the_launcher_a_config_it_takes():
    shipped = yaml.safe_load((REPO / "deploy" / "dagster-k8s.yaml").read_text())
    assert _valid(shipped["run_launcher"]["config"]) == []
    assert shipped["storage"]["postgres"]["postgres_db"]["scheme"] == "postgresql+psycopg2"
