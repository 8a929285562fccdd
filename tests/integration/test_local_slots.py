"""Embedded mode, with the real queue daemon and real run workers: a GPU step beyond its class's local
slots waits inside its started run, whose event log says why; only GPU steps hold slots, so CPU
steps and other classes run meanwhile; the slot's device is what the Function sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import lancedb
import pytest
import yaml
from dagster import DagsterEventType, DagsterRunStatus

from gpufn_dagster.class_files import load_gpu_classes
from gpufn_dagster.embedded.coordinator import embedded_class_gauges


from ..conftest import wait_for
from ..helpers import LOCAL_DEFS as DEFS, docs_column, embedded, event_metadata, finish, gpufn_serve, submit

def messages(instance, run_id: str) -> str:
    return "\n".join(e.message for e in instance.all_logs(run_id) if e.is_dagster_event and e.message)


def pending(instance, pool: str = "gpu-default") -> list[str]:
    """The runs whose steps wait for a slot of the pool (a step given a slot stays listed, assigned)."""
    return [p.run_id for p in instance.event_log_storage.get_concurrency_info(pool).pending_steps
            if p.assigned_timestamp is None]


def holders(instance, pool: str = "gpu-default") -> list[str]:
    return [s.run_id for s in instance.event_log_storage.get_concurrency_info(pool).claimed_slots]


def holder_and_waiter(instance, runs: set[str]) -> tuple[str, str]:
    """(the run holding the pool's one slot, the run whose GPU step waits for it) of two runs launched
    together: their run workers start side by side, so either may claim the slot first."""
    wait_for(lambda: len(holders(instance)) == 1 and len(pending(instance)) == 1, timeout=180,
             what="one run holding the slot, the other's GPU step waiting for it")
    (holder,), (waiter,) = holders(instance), pending(instance)
    assert {holder, waiter} == runs
    return holder, waiter


def scraped(text: str, gpu_class: str) -> dict[str, float]:
    """One class's gauges from Prometheus' text format: figure -> value."""
    prefix, label = "gpufn_gpu_class_", f'{{gpu_class="{gpu_class}",'
    return {line.split("{")[0][len(prefix):]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith(prefix) and label in line}


def succeeded_steps(instance, run_id: str) -> set[str]:
    return {e.step_key for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)}


@pytest.mark.parametrize("storage", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_gpu_step_beyond_local_slots_waits_in_its_started_run_then_runs(tmp_path, monkeypatch, classes_dir, storage,
                                                                       request):
    url = request.getfixturevalue("postgres_url") if storage == "postgres" else None
    with embedded(tmp_path, monkeypatch, classes_dir, postgres_url=url, local={"slots": 1, "devices": ["3"]}) as (
            instance, workspace, queue_pass, open_gate):
        assert type(instance.run_storage).__name__ == ("PostgresRunStorage" if url else "SqliteRunStorage")
        runs = {submit(workspace, "docs__slow"), submit(workspace, "docs__slow")}
        queue_pass()  # launches both: a run whose GPU step must wait still starts
        first, second = holder_and_waiter(instance, runs)
        assert instance.get_run_by_id(second).status == DagsterRunStatus.STARTED  # never failed, never on CPU
        # Dagster's own line: its executor writes it just after it records the step's pending claim.
        wait_for(lambda: "Step blocked by limit for pool gpu-default" in messages(instance, second), timeout=60,
                 what="Dagster's line that the step is blocked by the pool")

        queue_pass()  # the pass that describes the wait on the run's page and in its tags
        run = instance.get_run_by_id(second)
        assert run.tags["gpufn/capacity"] == "waiting" and run.tags[".dagster/gpufn-capacity-reason"] == "LocalSlotsInUse"
        assert run.tags["gpufn/gpu-class"] == "default" and "T" in run.tags[".dagster/gpufn-waiting-since"]
        # the runs list shows who has the GPU: `running` once its step holds the slot (its lock), a pass later at most
        holder = wait_for(lambda: (queue_pass(), instance.get_run_by_id(first).tags)[1].get("gpufn/capacity") and
                          instance.get_run_by_id(first).tags, timeout=120, what="the holder's step holding its slot")
        assert (holder["gpufn/capacity"], holder[".dagster/gpufn-capacity-reason"]) == ("running", "SlotAcquired")
        said = [m for m in event_metadata(instance, second) if "Local slots" in m]
        assert [(m["GPU class"], m["Local slots"], m["Position"], m["Slots held by"]) for m in said] \
            == [("default", 1, "1 of 1", f"{first[:8]}/docs__slow")], said
        queue_pass()  # nothing changed: nothing repeated
        assert len([m for m in event_metadata(instance, second) if "Local slots" in m]) == 1

        # The operator's view on the command line.
        listed = subprocess.run([sys.executable, "-m", "gpufn_dagster.cli", "capacity", "--json"], check=True,
                                capture_output=True, text=True, env={**os.environ, "DAGSTER_HOME": instance.root_directory})
        assert [r["run_id"] for r in json.loads(listed.stdout)["default"]] == [second]
        # ... and Prometheus' view: `gpufn serve`'s /metrics, under its token, during the wait.
        with gpufn_serve(classes_dir, "t0ken", instance.root_directory) as base:
            with pytest.raises(urllib.error.HTTPError):
                urllib.request.urlopen(f"{base}/metrics", timeout=30)  # the same token rule as /v1/gpu/classes
            asked = urllib.request.Request(f"{base}/metrics", headers={"Authorization": "Bearer t0ken"})
            gauges = scraped(urllib.request.urlopen(asked, timeout=60).read().decode(), "default")
            since_created = time.time() - instance.get_run_record_by_id(second).create_timestamp.timestamp()
        assert {k: gauges[k] for k in ("capacity", "in_use", "steps_waiting", "runs_waiting")} == {
            "capacity": 1, "in_use": 1, "steps_waiting": 1, "runs_waiting": 1}
        assert 0 < gauges["longest_wait_seconds"] < since_created  # it waits since its step asked, after the run began

        open_gate(1)
        wait_for(lambda: instance.get_run_by_id(first).status == DagsterRunStatus.SUCCESS, timeout=240,
                 what="first run done")
        wait_for(lambda: not pending(instance), timeout=120, what="the second run's step got the freed slot")
        # the wait ended: the run's page and tags say so once its step holds the slot (a pass later at most)
        run = wait_for(lambda: (queue_pass(), instance.get_run_by_id(second))[1].tags.get("gpufn/capacity") == "running"
                       and instance.get_run_by_id(second), timeout=120, what="the second run's step holding the slot")
        assert run.tags["gpufn/capacity"] == "running" and run.tags[".dagster/gpufn-capacity-reason"] == "SlotAcquired"
        (waited,) = [m["Waited seconds"] for m in event_metadata(instance, second) if "Waited seconds" in m]
        assert 0 < waited < time.time() - instance.get_run_record_by_id(second).create_timestamp.timestamp()
        open_gate(2)
        wait_for(lambda: instance.get_run_by_id(second).status == DagsterRunStatus.SUCCESS, timeout=240,
                 what="second run done")
        queue_pass()  # both runs ended: the tags say the present
        run = instance.get_run_by_id(second)
        assert run.tags["gpufn/capacity"] == "released" and run.tags[".dagster/gpufn-capacity-reason"] == "RunEnded"
        logs = " ".join(e.user_message for e in instance.all_logs(second))
        assert "local GPU slot 0 of class 'default', CUDA_VISIBLE_DEVICES=3" in logs
        # The Function ran with its slot's device visible (class default: local.devices = ["3"]).
        values = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").to_arrow().column("slow").to_pylist()
        assert values and all(v.endswith("@3") for v in values)


def test_a_higher_priority_run_gets_the_freed_slot_first_and_the_other_run_is_told(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 1}) as (instance, workspace, queue_pass, open_gate):
        holder = submit(workspace, "docs__slow")
        queue_pass()
        wait_for(lambda: holders(instance) == [holder], timeout=180, what="the first run holding the slot")
        low = submit(workspace, "docs__slow")
        queue_pass()
        wait_for(lambda: pending(instance) == [low], timeout=180, what="the low-priority run's GPU step waiting")
        high = submit(workspace, "docs__slow", tags={"dagster/priority": "5"})
        queue_pass()
        wait_for(lambda: sorted(pending(instance)) == sorted([low, high]), timeout=180,
                 what="both later runs' GPU steps waiting")
        queue_pass()
        # Waiting since later, the higher priority is ahead, and the other run's page says so.
        def last_position(run_id: str) -> str:
            return [m["Position"] for m in event_metadata(instance, run_id) if "Local slots" in m][-1]

        assert (last_position(high), last_position(low)) == ("1 of 2", "2 of 2")

        open_gate(1)
        wait_for(lambda: holders(instance) == [high], timeout=240, what="the freed slot going to the high-priority run")
        assert pending(instance) == [low]
        open_gate(2)
        open_gate(3)
        for run_id in (holder, high, low):
            wait_for(lambda: instance.get_run_by_id(run_id).status == DagsterRunStatus.SUCCESS, timeout=240,
                     what=f"run {run_id[:8]} done")


def test_materialize_all_mixes_classes_and_only_gpu_steps_hold_slots(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 1}) as (instance, workspace, queue_pass, open_gate):
        holder = submit(workspace, "docs__slow")
        queue_pass()
        wait_for(lambda: holders(instance) == [holder], timeout=180,
                 what="the holder's GPU step holding class default's slot")
        everything = submit(workspace, "docs__slow", "docs__reversed", "docs__size")
        assert instance.get_run_by_id(everything).tags["gpufn/gpu-class"] == "default,l4"
        queue_pass()
        # While class default's slot is held, the CPU step and the l4 step of the same run finish.
        wait_for(lambda: succeeded_steps(instance, everything) >= {"docs__reversed", "docs__size"}
                 and pending(instance) == [everything], timeout=240,
                 what="CPU and l4 steps done while the default step waits")
        assert instance.get_run_by_id(everything).status == DagsterRunStatus.STARTED
        assert "docs__slow" not in succeeded_steps(instance, everything)
        open_gate(1)
        open_gate(2)
        wait_for(lambda: instance.get_run_by_id(everything).status == DagsterRunStatus.SUCCESS, timeout=240,
                 what="Materialize all done")
        table = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").to_arrow()
        assert table.column("reversed").to_pylist()[0] == "0d" and table.column("size").to_pylist()[0] == 2


def test_a_class_without_local_slots_refuses_its_runs_at_once(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 0}) as (instance, workspace, _, _open_gate):
        run = instance.get_run_by_id(submit(workspace, "docs__slow"))
        assert run.status == DagsterRunStatus.FAILURE  # not waiting forever
        assert "GPU class 'default' has local.slots: 0" in messages(instance, run.run_id)


def test_a_local_wait_past_max_wait_ends_the_run(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 1}, max_wait="3s") as (
            instance, workspace, queue_pass, open_gate):
        runs = {submit(workspace, "docs__slow"), submit(workspace, "docs__slow")}
        queue_pass()
        first, second = holder_and_waiter(instance, runs)
        since = min(p.enqueued_timestamp.timestamp() for p in
                    instance.event_log_storage.get_concurrency_info("gpu-default").pending_steps if p.run_id == second)
        queue_pass()  # a pass within max_wait (if the machine got here in time): it keeps waiting
        if time.time() - since < 2.5:
            assert instance.get_run_by_id(second).status == DagsterRunStatus.STARTED
        time.sleep(max(0.0, since + 3.5 - time.time()))

        def ended() -> bool:
            queue_pass()  # the queue daemon's passes past max_wait
            return instance.get_run_by_id(second).is_finished

        wait_for(ended, timeout=120, what="the waiting run ended")
        run = instance.get_run_by_id(second)
        assert run.status == DagsterRunStatus.CANCELED and run.tags["gpufn/capacity"] == "timed-out"
        assert run.tags[".dagster/gpufn-capacity-reason"] == "MaxWaitExceeded"
        (gave_up,) = [m for m in event_metadata(instance, second) if "max_wait seconds" in m]
        assert (gave_up["GPU class"], gave_up["max_wait seconds"]) == ("default", 3) and gave_up["Waited seconds"] >= 3
        assert instance.get_run_by_id(first).status == DagsterRunStatus.STARTED  # the one holding the slot is left be
        assert pending(instance) == []  # its claim was given back


def test_a_step_asking_for_two_gpus_takes_two_slots_and_sees_both_devices(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir, defs=DEFS.with_name("local_gpus_defs.py"),
                  max_gpu_count_per_worker=2, local={"slots": 3, "devices": ["5", "6", "7"]}) as (
            instance, workspace, queue_pass, open_gate):
        gates = Path(os.environ["GPUFN_TEST_GATES"])
        one = submit(workspace, "docs__slow")
        queue_pass()
        wait_for(lambda: (gates / "ticket-1").exists(), timeout=180, what="the one-GPU step computing")
        pair = submit(workspace, "docs__pair")
        queue_pass()
        wait_for(lambda: (gates / "ticket-2").exists(), timeout=180, what="the two-GPU step computing")
        third = submit(workspace, "docs__later")
        queue_pass()
        # The pool admits a third step (3 slots, 2 steps), but the 3 GPUs are held: it waits for one.
        wait_for(lambda: not [m for m in event_metadata(instance, third) if "Local slots" in m]
                 and instance.get_run_by_id(third).status == DagsterRunStatus.STARTED, timeout=180,
                 what="the third run started")
        time.sleep(5)
        assert not (gates / "ticket-3").exists()  # not computing while all three GPUs are held
        open_gate(1)  # the one-GPU step ends, freeing slot 0
        wait_for(lambda: (gates / "ticket-3").exists(), timeout=240, what="the third step got the freed GPU")
        open_gate(2)
        open_gate(3)
        for run_id in (one, pair, third):
            wait_for(lambda r=run_id: instance.get_run_by_id(r).status == DagsterRunStatus.SUCCESS, timeout=240,
                     what=f"run {run_id} done")
        logs = {r: " ".join(e.user_message for e in instance.all_logs(r)) for r in (one, pair, third)}
        assert "local GPU slot 0 of class 'default', CUDA_VISIBLE_DEVICES=5" in logs[one]
        assert "local GPU slots 1, 2 of class 'default', CUDA_VISIBLE_DEVICES=6,7" in logs[pair]
        assert "local GPU slot 0 of class 'default', CUDA_VISIBLE_DEVICES=5" in logs[third]
        values = lancedb.connect(os.environ["GPUFN_LANCEDB_URI"]).open_table("docs").to_arrow().column("pair").to_pylist()
        assert values and all(v.endswith("@6,7") for v in values)  # the Function saw both devices


def test_a_step_asking_for_more_gpus_than_local_slots_fails_at_once_as_never_fits(tmp_path, monkeypatch, classes_dir):
    with embedded(tmp_path, monkeypatch, classes_dir, defs=DEFS.with_name("local_gpus_defs.py"),
                  max_gpu_count_per_worker=2, local={"slots": 1}) as (instance, workspace, _, _open_gate):
        run = instance.get_run_by_id(submit(workspace, "docs__pair"))
        assert run.status == DagsterRunStatus.FAILURE  # not waiting forever
        assert (run.tags["gpufn/capacity"], run.tags[".dagster/gpufn-capacity-reason"]) == ("never-fits", "NeverFits")
        assert ("a step asks for 2 GPUs of class 'default', whose local.slots is 1 (a slot is one GPU)"
                in messages(instance, run.run_id))


def test_a_broken_class_file_holds_only_gpu_runs_and_fixing_it_lets_them_go_without_a_restart(
        tmp_path, monkeypatch, classes_dir):
    l4 = classes_dir / "l4.yaml"
    good = l4.read_text()
    l4.write_text(good + "gpu_memroy: 24GiB\n")  # a typo in one file of classes/
    with embedded(tmp_path, monkeypatch, classes_dir, local={"slots": 1}) as (instance, workspace, queue_pass, open_gate):
        cpu = submit(workspace, "docs__size")  # the code location loaded, and a CPU run goes as ever
        gpu = submit(workspace, "docs__slow")
        for _ in range(3):
            queue_pass()  # no pass fails on the class files
        wait_for(lambda: instance.get_run_by_id(cpu).status == DagsterRunStatus.SUCCESS, timeout=180,
                 what="the CPU run to succeed while the class files are broken")
        run = instance.get_run_by_id(gpu)
        assert run.status == DagsterRunStatus.QUEUED  # held: neither failed nor started
        assert (run.tags["gpufn/capacity"], run.tags[".dagster/gpufn-capacity-reason"]) == ("waiting", "ClassesInvalid")
        said = messages(instance, gpu)
        assert "Held in the queue: its GPU steps need a GPU class and the class files do not load" in said, said
        assert f"{l4}: class 'l4': field 'gpu_memroy': unknown field (did you mean 'gpu_memory'?)" in said, said

        l4.write_text(good)  # fixed: the held run goes on the next pass, no restart
        open_gate(1)
        queue_pass()
        wait_for(lambda: instance.get_run_by_id(gpu).status == DagsterRunStatus.SUCCESS, timeout=240,
                 what="the held GPU run to start and succeed once the class files load")
        assert [m["Capacity reason"] for m in event_metadata(instance, gpu) if "Capacity reason" in m] == ["ClassesLoaded"]
        assert instance.get_run_by_id(gpu).tags["gpufn/placement"] == "local"


def test_a_function_accepting_two_classes_takes_the_first_with_a_free_slot_and_says_which(
        tmp_path, monkeypatch, classes_dir):
    l4 = yaml.safe_load((classes_dir / "l4.yaml").read_text())
    (classes_dir / "l4.yaml").write_text(yaml.safe_dump({**l4, "local": {"slots": 1, "devices": ["7"]}}))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=DEFS.with_name("local_choice_defs.py"),
                  local={"slots": 1, "devices": ["3"]}) as (instance, workspace, queue_pass, open_gate):
        gates = Path(os.environ["GPUFN_TEST_GATES"])
        holder = submit(workspace, "docs__slow")
        queue_pass()
        wait_for(lambda: (gates / "ticket-1").exists(), timeout=180, what="docs__slow computing on default's slot")
        second = submit(workspace, "docs__either")  # accepts default, then l4: default's one slot is held
        assert instance.get_run_by_id(second).tags["gpufn/gpu-class"] == "default|l4"
        # one count: default's slot is held by docs__slow, so the choice's pool admits one step (l4's free slot)
        assert instance.event_log_storage.get_concurrency_info("gpu-default|l4").slot_count == 1
        queue_pass()
        wait_for(lambda: (gates / "ticket-2").exists(), timeout=180, what="docs__either computing")
        assert instance.get_run_by_id(second).tags["gpufn/gpu-class-got"] == "l4"
        gauges = {g.gpu_class: g for g in embedded_class_gauges(instance, load_gpu_classes(classes_dir), time.time())}
        # the choice's own line: its classes' slots together, held by any step (one count with the classes' lines)
        assert (gauges["default|l4"].capacity, gauges["default|l4"].in_use) == (2, 2)
        assert gauges["default"].in_use == 1  # docs__slow
        open_gate(1)
        open_gate(2)
        for run_id in (holder, second):
            wait_for(lambda r=run_id: instance.get_run_by_id(r).status == DagsterRunStatus.SUCCESS, timeout=240,
                     what=f"run {run_id[:8]} done")
        log = " ".join(e.user_message for e in instance.all_logs(second))
        assert "CUDA_VISIBLE_DEVICES=7 (choice 2 of default, l4: default had no free slot)" in log
        assert set(docs_column("either")) == {f"D{i}@7" for i in range(6)}  # computed on l4's device
        (materialized,) = instance.all_logs(second, of_type=DagsterEventType.ASSET_MATERIALIZATION)
        metadata = materialized.dagster_event.event_specific_data.materialization.metadata
        assert metadata["gpu_class"].value == "l4"  # billed at the class it got

        # now default is free: the first choice. The choice runs alone: beside docs__slow in one run, which
        # of the two steps claims default's one slot first is the executor's race, not the choice's rule.
        third = submit(workspace, "docs__either")
        queue_pass()
        wait_for(lambda: "of class 'default', CUDA_VISIBLE_DEVICES=3 (first choice of default, l4)"
                 in " ".join(e.user_message for e in instance.all_logs(third)), timeout=180, what="the third on default")
        open_gate(3)
        assert finish(instance, queue_pass, third).status == DagsterRunStatus.SUCCESS
        assert instance.get_run_by_id(third).tags["gpufn/gpu-class-got"] == "default"


def test_a_choice_whose_classes_are_all_held_waits_as_it_says_and_runs_once_its_step_holds_a_slot(
        tmp_path, monkeypatch, classes_dir):
    """Both classes of `default|l4` held by single-class runs: the choice's run is tagged waiting (never
    running) and its page names every class of the choice and who holds each; once one frees, its
    step takes it, and only then is the run running."""
    l4 = yaml.safe_load((classes_dir / "l4.yaml").read_text())
    (classes_dir / "l4.yaml").write_text(yaml.safe_dump({**l4, "local": {"slots": 1, "devices": ["7"]}}))
    with embedded(tmp_path, monkeypatch, classes_dir, defs=DEFS.with_name("local_choice_defs.py"),
                  local={"slots": 1, "devices": ["3"]}) as (instance, workspace, queue_pass, open_gate):
        gates = Path(os.environ["GPUFN_TEST_GATES"])
        holders = [submit(workspace, "docs__slow"), submit(workspace, "docs__on_l4")]
        queue_pass()
        wait_for(lambda: (queue_pass(), (gates / "ticket-2").exists())[1], timeout=240,
                 what="both single-class runs computing, each on its class's one slot")
        choice = submit(workspace, "docs__either")
        states = []

        def waiting_said() -> list[dict]:
            queue_pass()
            states.append(instance.get_run_by_id(choice).tags.get("gpufn/capacity"))
            return [m for m in event_metadata(instance, choice) if m.get("GPU class") == "default|l4"]

        (said_so, *_) = wait_for(waiting_said, timeout=240, what="the choice's wait said on its page")
        assert instance.get_run_by_id(choice).tags["gpufn/capacity"] == "waiting"
        assert instance.get_run_by_id(choice).tags[".dagster/gpufn-capacity-reason"] == "LocalSlotsInUse"
        assert holders[0][:8] in said_so["Class default held by"] and holders[1][:8] in said_so["Class l4 held by"]
        for _ in range(4):  # it stays waiting while both are held
            queue_pass()
            time.sleep(0.5)
        assert "running" not in states + [instance.get_run_by_id(choice).tags.get("gpufn/capacity")], states

        open_gate(1)  # the first holder ends: its class's slot frees, and the choice's step takes it
        wait_for(lambda: (queue_pass(), (gates / "ticket-3").exists())[1], timeout=240,
                 what="the choice's step computing on the freed slot")
        wait_for(lambda: (queue_pass(), instance.get_run_by_id(choice).tags.get("gpufn/capacity") == "running")[1],
                 timeout=60, what="the choice's run tagged running once its step holds a slot")
        assert instance.get_run_by_id(choice).tags["gpufn/gpu-class-got"] in {"default", "l4"}
        open_gate(2)
        open_gate(3)
        for run_id in (*holders, choice):
            assert finish(instance, queue_pass, run_id).status == DagsterRunStatus.SUCCESS
