"""When a shard's GPUs became its (`assets.gpu_time`): on a local slot, when it took the slot; in a
pod of its own, when the pod's container (the step's process) started."""

import os
import subprocess
import sys
import time

from gpufn_dagster.assets.gpu_time import held_since
from gpufn_dagster.embedded.procfs import age_seconds


def test_a_process_age_is_the_time_since_it_started():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(1.5)
        assert 1.0 <= age_seconds(child.pid) <= 10  # clock ticks: 10 ms, the machine loaded
    finally:
        child.kill()
        child.wait()


def test_a_step_in_a_pod_of_its_own_held_its_gpus_from_its_process_start_and_on_a_slot_from_now():
    age = age_seconds(os.getpid())
    assert age > 0.1  # this test process has imported pytest and gpufn_dagster
    in_pod = held_since({"gpufn/placement": "per-step"}, on_local_slot=False)
    assert abs((time.monotonic() - in_pod) - age) < 0.5
    for tags, on_slot in (({"gpufn/placement": "local"}, True), ({"gpufn/placement": "gpu"}, False), ({}, False)):
        assert time.monotonic() - held_since(tags, on_local_slot=on_slot) < 0.1
