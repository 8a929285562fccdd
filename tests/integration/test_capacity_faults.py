"""A frozen Kubernetes API server (it accepts connections and never answers) ends a watcher tick
with that reason within its request timeouts, instead of blocking the sensor daemon forever."""

from __future__ import annotations

import socket
import time

import kubernetes
import pytest
from dagster import DagsterInstance

from gpufn_dagster.run.k8s.watch import CapacityWatcher
from gpufn_dagster.class_files import load_gpu_classes

from ..conftest import CLASSES, launcher_at


def test_a_frozen_api_server_ends_the_tick_instead_of_blocking_it():
    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)  # the kernel completes handshakes; nobody ever reads or answers
        configuration = kubernetes.client.Configuration()
        configuration.host = f"https://127.0.0.1:{frozen.getsockname()[1]}"
        configuration.verify_ssl = False
        configuration.retries = 0
        client = kubernetes.client.ApiClient(configuration)
        watcher = CapacityWatcher(DagsterInstance.ephemeral(), kubernetes.client.CoreV1Api(client),
                                  kubernetes.client.BatchV1Api(client), load_gpu_classes(CLASSES), "default",
                                  request_timeout=(1.0, 2.0))
        started = time.monotonic()
        with pytest.raises(Exception) as err:
            watcher.tick()
        assert time.monotonic() - started < 60  # bounded by the request timeouts, not forever
        assert "timed out" in str(err.value).lower() or "timeout" in type(err.value).__name__.lower(), err.value


def test_the_sensor_says_a_tick_could_not_finish(tmp_path):
    import dagster as dg
    from dagster._core.test_utils import instance_for_test

    from gpufn_dagster.run.k8s.watch import capacity_sensor
    from gpufn_dagster.errors import KubernetesUnavailable

    with socket.socket() as frozen:
        frozen.bind(("127.0.0.1", 0))
        frozen.listen(16)
        host = f"https://127.0.0.1:{frozen.getsockname()[1]}"
        launcher = launcher_at(tmp_path, host, CLASSES)
        with instance_for_test(overrides={"run_launcher": launcher}) as instance:
            sensor = capacity_sensor(request_timeout=(1.0, 1.0))
            started = time.monotonic()
            with pytest.raises(KubernetesUnavailable) as err:
                sensor(dg.build_sensor_context(instance=instance))
            assert time.monotonic() - started < 120
    message = str(err.value)
    assert f"could not finish this tick: the Kubernetes API at {host} did not answer" in message
    assert "the next tick starts afresh" in message
