"""Wait estimates from a real Dagster instance's history: finished runs of the same work give the
typical duration (else the steps of its assets in any successful run), started runs of the class
hold its GPUs, and each waiting run gets a tag and an event, said again only when the estimate moves."""

from __future__ import annotations

import time

import dagster as dg
from dagster import DagsterRunStatus
from dagster._core.test_utils import create_run_for_test, instance_for_test

from gpufn_dagster.run.history import class_history, class_holders, report_estimates
from gpufn_dagster.tags import run_gpu_tags, time_tag

from ..helpers import event_metadata

L4 = run_gpu_tags("l4", 1)  # as the launcher tags a run of one l4 GPU


@dg.asset
def embedding() -> None:
    time.sleep(0.2)


def test_waiting_runs_get_an_estimate_from_history_and_unknown_without_it():
    with instance_for_test() as instance:
        for _ in range(2):  # two real runs of the work: its history
            assert dg.materialize([embedding], instance=instance, tags=L4).success
        history = class_history(instance, "l4")
        (work, durations), = history.items()
        assert len(durations) == 2 and all(0.2 <= d < 60 for d in durations), history
        create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED,
                            tags={**L4, "gpufn/capacity": "running"})  # holds the GPU
        waiting = [create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED,
                                       tags={**L4, "gpufn/capacity": "waiting"}) for _ in range(2)]
        stranger = create_run_for_test(instance, job_name="train", status=DagsterRunStatus.STARTED,
                                       tags={**L4, "gpufn/capacity": "waiting"})
        line = [stranger, *waiting]  # the run of unknown work first: nobody behind it can be estimated
        last = report_estimates(instance, {"l4": waiting}, {"l4": 1}, time.time(), reporter=type(instance))
        tags = [instance.get_run_by_id(r.run_id).tags[".dagster/gpufn-wait-estimate"] for r in waiting]
        assert tags == ["under a minute", "under a minute"], tags  # the holder and the run ahead take < 1 s
        assert last["l4"].text == "under a minute (1 run ahead on l4, typical under a minute each, 1 GPU in the class)"
        last = report_estimates(instance, {"l4": line}, {"l4": 1}, time.time(), reporter=type(instance))
        assert last["l4"].text.startswith("unknown (2 runs ahead on l4; no finished run of train")
        assert instance.get_run_by_id(waiting[1].run_id).tags[".dagster/gpufn-wait-estimate"] == "unknown"
        said = [e.message for e in instance.all_logs(waiting[1].run_id) if e.is_dagster_event and e.message]
        assert [m for m in said if "] Wait estimate: under a minute (1 run ahead on l4" in m], said
        assert [m for m in said if "] Wait estimate: unknown (2 runs ahead on l4" in m], said
        report_estimates(instance, {"l4": [instance.get_run_by_id(r.run_id) for r in line]}, {"l4": 1}, time.time(),
                         reporter=type(instance))
        again = [e.message for e in instance.all_logs(waiting[1].run_id) if e.is_dagster_event and e.message]
        assert sum("] Wait estimate" in m for m in again) == 2  # unchanged since: not said again


def test_a_run_queued_behind_does_not_move_the_estimate_of_the_run_ahead():
    """A run just started whose GPU step has not asked for its slot yet holds no GPU: before, it
    counted as a holder, and the run ahead's "under a minute" jumped to "about 2 min"."""
    with instance_for_test() as instance:
        assert dg.materialize([embedding], instance=instance, tags=L4).success
        (work,) = class_history(instance, "l4")
        create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED,
                            tags={**L4, "gpufn/capacity": "running"})
        ahead = create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED,
                                    tags={**L4, "gpufn/capacity": "waiting"})
        report_estimates(instance, {"l4": [ahead]}, {"l4": 1}, time.time(), reporter=type(instance))
        before = instance.get_run_by_id(ahead.run_id).tags[".dagster/gpufn-wait-estimate"]
        create_run_for_test(instance, job_name=work, status=DagsterRunStatus.STARTED, tags=L4)  # behind, starting
        report_estimates(instance, {"l4": [instance.get_run_by_id(ahead.run_id)]}, {"l4": 1}, time.time(),
                         reporter=type(instance))
        assert before == "under a minute" == instance.get_run_by_id(ahead.run_id).tags[".dagster/gpufn-wait-estimate"]


@dg.asset
def long_embedding() -> None:
    time.sleep(2.0)


def test_a_holder_counts_from_when_it_got_its_gpus_and_history_leaves_waits_out():
    with instance_for_test() as instance:
        assert dg.materialize([long_embedding], instance=instance, tags=L4).success
        (record,) = instance.get_run_records()
        # It waited for its GPU until 0.3 s before its end: its time on the GPU is that, not its whole run
        # (the tag has whole seconds: up to half a second either way).
        instance.add_run_tags(record.dagster_run.run_id, {".dagster/gpufn-holding-since": time_tag(record.end_time - 0.3)})
        (durations,) = class_history(instance, "l4").values()
        assert len(durations) == 1 and durations[0] <= 0.8 < record.end_time - record.start_time - 1.0, durations
        now = time.time()
        create_run_for_test(instance, job_name="train", status=DagsterRunStatus.STARTED,
                                     tags={**L4, "gpufn/capacity": "running", ".dagster/gpufn-holding-since": time_tag(now - 300)})
        (held,) = class_holders(instance, "l4", now)
        assert held.work == "train" and 299 <= held.elapsed <= 301, held  # since it got its GPU, not since created


def test_an_estimate_tag_never_stays_on_a_run_that_ended_while_waiting():
    from gpufn_dagster.run.run_plan import release_ended_runs

    with instance_for_test() as instance:
        run = create_run_for_test(instance, job_name="embed", status=DagsterRunStatus.STARTED,
                                  tags={**L4, "gpufn/capacity": "waiting", ".dagster/gpufn-wait-estimate": "about 2 min"})
        instance.report_run_failed(run, "terminated while it waited")
        release_ended_runs(instance)
        tags = instance.get_run_by_id(run.run_id).tags
        assert (tags["gpufn/capacity"], tags[".dagster/gpufn-wait-estimate"]) == ("released", "ended")


@dg.asset
def summary() -> None:
    time.sleep(0.2)


def test_an_asset_materialized_by_a_materialize_all_has_history_for_a_run_of_it_alone():
    """Before, only runs of the identical selection counted: right after a Materialize all the
    estimate said "unknown (... no finished run of embedding ...)", and a holder past its typical
    time made the next run's estimate "now" while it still waited."""
    with instance_for_test() as instance:
        assert dg.materialize([embedding, summary], instance=instance, tags=L4).success  # a Materialize all
        assert "embedding" not in class_history(instance, "l4")  # its run did more than embedding
        alone = {dg.AssetKey("embedding")}
        create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTED, asset_selection=alone,
                            tags={**L4, "gpufn/capacity": "running",
                                  ".dagster/gpufn-holding-since": time_tag(time.time() - 300)})  # long past 0.2 s
        waiting = [create_run_for_test(instance, job_name="__ASSET_JOB", status=DagsterRunStatus.STARTED,
                                       asset_selection=alone, tags={**L4, "gpufn/capacity": "waiting"})
                   for _ in range(2)]
        last = report_estimates(instance, {"l4": waiting}, {"l4": 1}, time.time(), reporter=type(instance))
        tags = [instance.get_run_by_id(r.run_id).tags[".dagster/gpufn-wait-estimate"] for r in waiting]
        assert tags == ["any moment", "under a minute"], tags
        assert last["l4"].seconds is not None and 0.2 <= last["l4"].seconds < 60, last
        said = [m for m in event_metadata(instance, waiting[0].run_id) if "Estimate" in m]
        assert said == [{"Estimate": "any moment", "Runs ahead": 0, "GPU class": "l4", "Class GPUs": 1}], said
