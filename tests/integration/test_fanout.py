"""One refresh spread over several GPU workers, with real run workers: the embedded coordinator
and its daemon, Dagster's multiprocess executor, one process per shard, each on a local slot of
its class (its own device). All rows are filled exactly once across the shards, the commit is
one table version, a killed shard resumes without redoing the others' work, a shard that keeps
failing fails the run and commits nothing, and a user's append meanwhile is kept."""

from __future__ import annotations

import logging
import os
import signal
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import lancedb
import pyarrow as pa
from dagster import DagsterEventType, DagsterRunStatus
from dagster._core.test_utils import create_test_daemon_workspace_context, instance_for_test
from dagster._core.workspace.load_target import PythonFileTarget
from dagster._daemon.monitoring.concurrency import execute_concurrency_slots_iteration
from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon
from dagster_graphql.client.query import LAUNCH_PIPELINE_EXECUTION_MUTATION
from dagster_graphql.test.utils import execute_dagster_graphql
import pytest

from gpufn_dagster.refresh.checkpoint import chunk_span
from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.assets.resources import STABLE_ROW_IDS
from tests.storages import STORAGES

DEFS = Path(__file__).with_name("fanout_defs.py")
# Each shard loads its Function in its own step process here (warm: {idle: 0}), so the tests see
# the step processes themselves; test_warm_instances covers shards handing their calls to warm ones.
WIDE = "name: wide\ngpu_model: TEST\ngpu_memory: 16GiB\nmax_gpu_count_per_worker: 1\n" \
       "local: {slots: 4, devices: ['0', '1', '2', '3'], warm: {idle: 0}}\n"


@contextmanager
def fanout(db_uri: str, tmp_path, monkeypatch, classes_dir, rows: int, warm_run_workers: bool | None = None,
           **env: str):
    """An embedded instance serving fanout_defs over a `docs` table of `rows` rows in one fragment.

    Yields (instance, run(run_config=None, during=None) -> the run once it ended, the log path);
    `during(run_id)` is called while the run goes on until it returns True; `run.workspace` is the
    daemon's workspace (its GraphQL context). `warm_run_workers`: launch with gpufn's launcher, as
    the embedded default does (None: Dagster's default launcher, each run a child of the code server).
    """
    log = tmp_path / "calls.log"
    (classes_dir / "wide.yaml").write_text(WIDE)
    for name, value in {"GPUFN_LANCEDB_URI": db_uri, "GPUFN_CLASSES_DIR": str(classes_dir),
                        "GPUFN_TEST_LOG": str(log), "GPUFN_TEST_KILLED": str(tmp_path / "killed"), **env}.items():
        monkeypatch.setenv(name, value)
    lancedb.connect(db_uri).create_table(
        "docs", pa.table({"id": list(range(rows)), "text": [f"doc {i}" for i in range(rows)]}),
        storage_options=STABLE_ROW_IDS)
    overrides = {"run_coordinator": {"module": "gpufn_dagster", "class": "GpuQueuedRunCoordinator",
                                     "config": {"classes_dir": str(classes_dir)}}}
    if warm_run_workers is not None:  # as deploy/dagster-embedded.yaml: gpufn's launcher (embedded.launcher),
        overrides["run_launcher"] = {"module": "gpufn_dagster", "class": "GpuLocalRunLauncher",
                                     "config": {"warm_run_workers": warm_run_workers}}
        # ... and the monitoring daemon freeing the pool slots of runs that ended (each pass below)
        overrides["run_monitoring"] = {"enabled": True, "free_slots_after_run_end_seconds": 1}
    target = PythonFileTarget(python_file=str(DEFS), attribute="defs", working_directory=None, location_name="fanout")
    with instance_for_test(overrides=overrides) as instance, \
            create_test_daemon_workspace_context(target, instance) as workspace:
        daemon = QueuedRunCoordinatorDaemon(interval_seconds=1)

        def run(run_config: dict | None = None, during=None):
            context = workspace.create_request_context()
            result = execute_dagster_graphql(context, LAUNCH_PIPELINE_EXECUTION_MUTATION, variables={
                "executionParams": {
                    "selector": {"repositoryLocationName": "fanout", "repositoryName": "__repository__",
                                 "pipelineName": "__ASSET_JOB", "assetSelection": [{"path": ["docs__shout"]}]},
                    "runConfigData": run_config or {}, "mode": "default"}})
            launched = result.data["launchPipelineExecution"]
            assert launched["__typename"] == "LaunchRunSuccess", launched
            run_id = launched["run"]["runId"]
            deadline = time.monotonic() + 600  # a hang guard only
            while time.monotonic() < deadline:
                list(daemon.run_iteration(workspace))
                list(execute_concurrency_slots_iteration(workspace, logging.getLogger("monitoring")))
                if during is not None and during(run_id):
                    during = None
                found = instance.get_run_by_id(run_id)
                if found.status in (DagsterRunStatus.SUCCESS, DagsterRunStatus.FAILURE, DagsterRunStatus.CANCELED):
                    return found
                time.sleep(0.5)
            raise AssertionError(f"run {run_id} did not end: {messages(instance, run_id)[-3000:]}")

        run.workspace = workspace  # for a test that asks the GraphQL API more than to launch
        yield instance, run, log


def messages(instance, run_id: str) -> str:
    return "\n".join(e.message for e in instance.all_logs(run_id) if e.message)


def materialization(instance, run_id: str) -> dict:
    (event,) = instance.all_logs(run_id, of_type=DagsterEventType.ASSET_MATERIALIZATION)
    return {k: v.value for k, v in event.dagster_event.event_specific_data.materialization.metadata.items()}


def calls(log: Path) -> list[tuple[str, str, str]]:
    return [tuple(line.split("|")) for line in log.read_text().splitlines()] if log.exists() else []


def table(db_uri: str) -> dict:
    data = lancedb.connect(db_uri).open_table("docs").to_lance().to_table(columns=["text", "shout"])
    return dict(zip(data.column("text").to_pylist(), data.column("shout").to_pylist(), strict=True))


def refresh_commits(db_uri: str) -> list[str]:
    dataset = lancedb.connect(db_uri).open_table("docs").to_lance()
    return [type(t.operation).__name__ for t in dataset.get_transactions() if t is not None
            and type(t.operation).__name__ == "DataReplacement"]


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_one_fragment_is_spread_over_four_shard_processes_each_on_its_own_device(db_uri, tmp_path, monkeypatch,
                                                                                  classes_dir):
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    with fanout(db_uri, tmp_path, monkeypatch, classes_dir, rows=8000,
                GPUFN_TEST_BARRIER=str(barrier)) as (instance, run, log):
        done = run()
        assert done.status == DagsterRunStatus.SUCCESS, messages(instance, done.run_id)[-3000:]
        made = calls(log)
        assert Counter(text for text, _, _ in made) == Counter(f"doc {i}" for i in range(8000))  # each row once
        # Four worker processes held their slots at once (they met at their first row), each on its
        # slot's device, and each computed its own shard: 2,000 rows on each device.
        assert Counter(device for _, device, _ in made) == {"0": 2000, "1": 2000, "2": 2000, "3": 2000}
        assert len({pid for _, _, pid in made}) == 4
        assert all(len({d for _, d, p in made if p == pid}) == 1 for pid in {p for _, _, p in made})
        meta = materialization(instance, done.run_id)
        assert meta["workers"] == 4 and meta["rows_computed"] == 8000
        # Each shard held its GPU slot for no longer than its step ran (Dagster's events), at least
        # as long as its Function's calls; planning and committing held none.
        spans = _step_spans(instance, done.run_id)
        shards = {r["shard"]: r for r in (dict(row.data) for row in meta["shards"].records)}
        assert all(0 < shards[i]["gpu_held_seconds"] <= spans[f"docs__shout.docs__shout_shard[shard_{i}]"] + 0.01
                   for i in range(4))
        assert abs(meta["gpu_held_seconds"] - sum(r["gpu_held_seconds"] for r in shards.values())) < 0.05
        assert all(value == text.upper() for text, value in table(db_uri).items())
        steps = {e.step_key for e in instance.all_logs(done.run_id, of_type=DagsterEventType.STEP_SUCCESS)}
        assert {f"docs__shout.docs__shout_shard[shard_{i}]" for i in range(4)} <= steps
        # One commit of the column, the table's latest version; the shards' hand-offs are cleared.
        assert refresh_commits(db_uri) == ["DataReplacement"]
        assert meta["table_version_after"] == lancedb.connect(db_uri).open_table("docs").version
        assert TableFiles(f"{db_uri}/_gpufn_runs").names("") == []
        # Plan, shards and commit ran in six processes, each with its own value of a global the
        # Function reads; the version the rows carry is the one this process (as the code server)
        # computes, and the next refresh finds nothing to do.
        assert meta["function_version"] == _code_server_version(monkeypatch)
        log.unlink()
        again = run()
        assert again.status == DagsterRunStatus.SUCCESS and materialization(instance, again.run_id)["rows_computed"] == 0
        assert calls(log) == []


def test_shard_steps_fork_from_a_preloaded_forkserver_unless_the_run_asks_for_spawn(db_uri, tmp_path, monkeypatch,
                                                                                    classes_dir):
    """build_definitions' executor starts a run's step processes from a forkserver that imported the
    engine once (Dagster's `forkserver` start method); `start_method: {spawn: {}}` in the run's
    executor config still gives a fresh interpreter per step, children of the run worker itself.
    The forkserver froze what it preloaded (`gc.freeze`), so a forked step's garbage collections
    leave that heap alone; a spawned step has nothing frozen."""
    parents = tmp_path / "parents.log"
    with fanout(db_uri, tmp_path, monkeypatch, classes_dir, rows=8000,
                GPUFN_TEST_PARENTS=str(parents)) as (instance, run, log):
        def started(run_id: str) -> tuple[int, set[int], list[int]]:
            """(the run worker's pid, the parents of the processes that computed rows, their frozen objects)"""
            (executing,) = [e for e in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
                            if "Executing steps using multiprocess executor" in (e.message or "")]
            worker = int(executing.dagster_event.engine_event_data.metadata["pid"].value)
            lines = [line.split("|") for line in parents.read_text().splitlines()]
            parents.unlink()
            assert len(lines) == 4, lines  # one line per shard process
            return worker, {int(parent) for _, parent, _ in lines}, [int(frozen) for *_, frozen in lines]

        done = run()
        assert done.status == DagsterRunStatus.SUCCESS, messages(instance, done.run_id)[-3000:]
        worker, forked_from, frozen = started(done.run_id)
        assert len(forked_from) == 1 and worker not in forked_from  # one forkserver, not the worker
        assert min(frozen) > 100_000, frozen  # Dagster, Arrow, Lance and the engine: left out of the steps' collections
        lancedb.connect(db_uri).open_table("docs").add(pa.table({"id": list(range(8000, 16000)),
                                                                  "text": [f"doc {i}" for i in range(8000, 16000)]}))
        spawned = run(run_config={"execution": {"config": {"start_method": {"spawn": {}}}}})
        assert spawned.status == DagsterRunStatus.SUCCESS, messages(instance, spawned.run_id)[-3000:]
        worker, spawned_by, frozen = started(spawned.run_id)
        assert spawned_by == {worker} and frozen == [0] * 4
        assert len(calls(log)) == 16000  # each row once over both runs


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_a_killed_shard_is_retried_and_resumes_without_redoing_other_shards(db_uri, tmp_path, monkeypatch,
                                                                              classes_dir):
    with fanout(db_uri, tmp_path, monkeypatch, classes_dir, rows=8000,
                GPUFN_TEST_KILL_AT="doc 2600") as (instance, run, log):
        done = run()
        assert done.status == DagsterRunStatus.SUCCESS, messages(instance, done.run_id)[-3000:]
        assert (tmp_path / "killed").exists()
        counts = Counter(text for text, _, _ in calls(log))
        assert set(counts) == {f"doc {i}" for i in range(8000)}
        restarts = instance.all_logs(done.run_id, of_type=DagsterEventType.STEP_RESTARTED)
        assert [e.step_key for e in restarts] == ["docs__shout.docs__shout_shard[shard_1]"]
        again = [text for text, n in counts.items() if n > 1]
        # Only the killed shard (rows 2000-3999) repeats work: at most the one call in flight (50 rows)
        # plus those staged ahead of the writer (prefetch 4), never a row of another shard.
        assert all(2000 <= int(text.split()[1]) < 4000 for text in again), again
        assert len(again) <= 50 * 5
        assert all(value == text.upper() for text, value in table(db_uri).items())
        assert refresh_commits(db_uri) == ["DataReplacement"]


FORCE_TERMINATE = """mutation($runId: String!) {
  terminateRun(runId: $runId, terminatePolicy: MARK_AS_CANCELED_IMMEDIATELY) { __typename
  ... on TerminateRunFailure { message } ... on PythonError { message } } }"""


def _kill_run(instance, run_id: str, log: Path) -> None:
    """SIGKILL a running fan-out's run worker and every process that computed rows (and the
    forkserver they came from), as a node lost under it would."""
    (executing,) = [e for e in instance.all_logs(run_id, of_type=DagsterEventType.ENGINE_EVENT)
                    if "Executing steps using multiprocess executor" in (e.message or "")]
    worker = int(executing.dagster_event.engine_event_data.metadata["pid"].value)
    shards = {int(pid) for *_, pid in calls(log)}
    parents = set()
    for pid in shards:
        try:
            parents.add(int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]))
        except (FileNotFoundError, ProcessLookupError):
            pass
    for pid in [worker, *shards, *(parents - {worker, os.getpid()})]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _saved_chunks(db_uri: str) -> dict[str, int]:
    """The checkpointed chunks of `docs.shout` now: object name -> rows it holds."""
    files = TableFiles(f"{db_uri}/docs.lance")
    return {name: span[1] - span[0] for name in files.names("_gpufn/checkpoints")
            if (span := chunk_span(name.rsplit("/", 1)[-1])) is not None}


def _chunk_rows(db_uri: str, name: str) -> set[str]:
    """The texts whose values a chunk holds (the value is the text, upper)."""
    data = TableFiles(f"{db_uri}/docs.lance").read(f"_gpufn/checkpoints/{name}")
    values = pa.ipc.open_file(pa.py_buffer(data)).read_all().column("shout").to_pylist()
    return {v.lower() for v in values if v is not None}


@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)
def test_a_new_run_adopts_the_parts_a_killed_fanned_out_run_saved_after_verifying_their_checksums(
        db_uri, tmp_path, monkeypatch, classes_dir):
    """A fanned-out run is SIGKILLed mid-refresh (its run worker and shard processes) and force-
    terminated as the UI does; a *new* run (not a re-execution) takes over its lease at once,
    computes none of the rows the killed run checkpointed, and says how many parts it adopted; a
    part whose bytes were damaged meanwhile fails its checksum and its rows are computed again."""
    # gpufn's launcher, as `dagster dev` with the embedded default runs: the run worker is not the
    # code server's child (under Dagster's default launcher, SIGKILLing it left the code server's
    # next start_run timing out).
    with fanout(db_uri, tmp_path, monkeypatch, classes_dir, rows=8000, warm_run_workers=True,
                GPUFN_TEST_DELAY="0.004") as (instance, run, log):
        saved: dict[str, int] = {}

        def kill_once_half_done(run_id: str) -> bool:
            if len(calls(log)) < 3000:
                return False
            _kill_run(instance, run_id, log)
            saved.update(_saved_chunks(db_uri))
            answer = execute_dagster_graphql(run.workspace.create_request_context(), FORCE_TERMINATE,
                                             variables={"runId": run_id})
            assert answer.data["terminateRun"]["__typename"] == "TerminateRunSuccess", answer.data
            return True

        killed = run(during=kill_once_half_done)
        assert killed.status == DagsterRunStatus.CANCELED
        assert refresh_commits(db_uri) == [] and set(table(db_uri).values()) == {None}  # nothing committed
        # The part a disk or a network damaged: its bytes change, its name (and checksum) stays.
        damaged = max(saved)
        files = TableFiles(f"{db_uri}/docs.lance")
        data = bytearray(files.read(f"_gpufn/checkpoints/{damaged}"))
        data[-200] ^= 0xFF
        files.write(f"_gpufn/checkpoints/{damaged}", bytes(data))
        finished = set().union(*(_chunk_rows(db_uri, name) for name in saved if name != damaged))
        redo = {f"doc {i}" for i in range(8000)} - finished
        assert len(finished) == sum(n for name, n in saved.items() if name != damaged) >= 2000

        log.unlink()
        started = time.monotonic()
        again = run()
        assert again.status == DagsterRunStatus.SUCCESS, messages(instance, again.run_id)[-3000:]
        assert time.monotonic() - started < 300  # it took the lease over: no wait for its 900 s ttl
        computed = Counter(text for text, _, _ in calls(log))
        assert not set(computed) & finished  # 0 finished rows recomputed
        assert set(computed) == redo and max(computed.values()) == 1  # the rest, each once
        meta = materialization(instance, again.run_id)
        assert meta["parts_adopted"] == len(saved) - 1 and meta["parts_damaged"] == 1
        assert meta["rows_adopted"] == len(finished) and meta["rows_computed"] == len(redo)
        assert f"adopted {len(saved) - 1:,} checkpointed part(s) ({len(finished):,} rows)" in messages(
            instance, again.run_id)
        assert all(value == text.upper() for text, value in table(db_uri).items())
        assert refresh_commits(db_uri) == ["DataReplacement"]


def test_a_shard_that_keeps_failing_fails_the_run_naming_it_and_commits_nothing(db_uri, tmp_path, monkeypatch,
                                                                                 classes_dir):
    with fanout(db_uri, tmp_path, monkeypatch, classes_dir, rows=8000,
                GPUFN_TEST_FAIL_AT="doc 5000") as (instance, run, log):
        done = run()
        assert done.status == DagsterRunStatus.FAILURE
        failures = instance.all_logs(done.run_id, of_type=DagsterEventType.STEP_FAILURE)
        assert {e.step_key for e in failures} == {"docs__shout.docs__shout_shard[shard_2]"}
        error = failures[-1].dagster_event.event_specific_data.error
        text = "\n".join(filter(None, [error.message, error.cause.message if error.cause else None]))
        assert "cannot shout 'doc 5000'" in text, text
        assert len(instance.all_logs(done.run_id, of_type=DagsterEventType.STEP_RESTARTED)) == 3  # retried, in vain
        assert refresh_commits(db_uri) == [] and set(table(db_uri).values()) == {None}
        assert "docs__shout.docs__shout_commit" not in {
            e.step_key for e in instance.all_logs(done.run_id, of_type=DagsterEventType.STEP_START)}


def test_a_users_append_during_a_fanned_out_refresh_is_kept_and_the_launchpad_sets_workers(
        db_uri, tmp_path, monkeypatch, classes_dir):
    with fanout(db_uri, tmp_path, monkeypatch, classes_dir, rows=4000,
                GPUFN_TEST_DELAY="0.002") as (instance, run, log):
        def append_once_computing(run_id: str) -> bool:
            if len(calls(log)) < 200:
                return False
            lancedb.connect(db_uri).open_table("docs").add(
                pa.table({"id": list(range(9000, 9100)), "text": [f"doc {i}" for i in range(9000, 9100)]}))
            return True

        two = {"ops": {"docs__shout": {"ops": {"docs__shout_plan": {"config": {"workers": 2}}}}}}
        done = run(two, during=append_once_computing)
        assert done.status == DagsterRunStatus.SUCCESS, messages(instance, done.run_id)[-3000:]
        meta = materialization(instance, done.run_id)
        assert meta["workers_asked"] == 2 and meta["workers"] == 2
        # Idle GPU time is what the shards held minus their Function's calls: each of the 4,000 rows
        # slept 2 ms inside the call, so at least 8 s of what they held was not idle.
        assert 0 < meta["gpu_idle_seconds"] <= meta["gpu_held_seconds"] - 4000 * 0.002
        values = table(db_uri)
        assert len(values) == 4100  # the appended rows are kept
        assert all(values[f"doc {i}"] == f"DOC {i}" for i in range(4000))
        assert all(values[f"doc {i}"] is None for i in range(9000, 9100))  # filled by the next refresh
        log.unlink()
        again = run()
        assert again.status == DagsterRunStatus.SUCCESS
        assert sorted(text for text, _, _ in calls(log)) == sorted(f"doc {i}" for i in range(9000, 9100))


def test_a_fanned_out_function_reading_another_functions_column_runs_after_it(db_uri, monkeypatch):
    import dagster as dg

    from gpufn_dagster import build_definitions, gpu_function

    lancedb.connect(db_uri).create_table("docs", pa.table({"id": list(range(3000)),
                                                            "text": [f"doc {i}" for i in range(3000)]}))

    @gpu_function(table="docs", column="shout", workers=3, gpu_class="default")
    def shout(text: str) -> str:
        return text.upper()

    @gpu_function(table="docs", column="size", workers=2)
    def size(shout: str) -> int:
        return len(shout)

    defs = build_definitions(assets=[size, shout], db_uri=db_uri)
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("docs__shout") in graph.get(dg.AssetKey("docs__size")).parent_keys
    result = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    data = lancedb.connect(db_uri).open_table("docs").to_lance().to_table(columns=["text", "size"]).to_pydict()
    assert data["size"] == [len(t) for t in data["text"]]
    # Nothing stale: the plan makes no shard, and the commit still reports a materialization.
    again = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    shard_steps = {e.step_key for e in again.all_events if e.event_type_value == "STEP_START" and "_shard[" in e.step_key}
    metadata = [{k: v.value for k, v in m.materialization.metadata.items()} for m in again.get_asset_materialization_events()]
    assert again.success and shard_steps == set() and [m["rows_computed"] for m in metadata] == [0, 0]


def test_fewer_shards_than_workers_asked_are_explained_in_the_plan_and_the_materialization(db_uri):
    import dagster as dg

    from gpufn_dagster import build_definitions, gpu_function

    lancedb.connect(db_uri).create_table("docs", pa.table({"id": list(range(500)),
                                                            "text": [f"doc {i}" for i in range(500)]}))

    @gpu_function(table="docs", column="shout", workers=8, gpu_class="default")
    def shout(text: str) -> str:
        return text.upper()

    defs = build_definitions(assets=[shout], db_uri=db_uri)
    result = dg.materialize(list(defs.assets), resources=defs.resources, instance=dg.DagsterInstance.ephemeral())
    assert result.success
    (event,) = result.get_asset_materialization_events()
    meta = {k: v.value for k, v in event.materialization.metadata.items()}
    assert (meta["workers_asked"], meta["workers"]) == (8, 1)
    assert meta["fewer_workers_because"] == "only 500 rows to compute, and a shard takes at least 1,024 rows"
    plan = next(e for e in result.all_events if e.event_type_value == "STEP_OUTPUT" and e.step_key.endswith("_plan")
                and e.event_specific_data.step_output_handle.output_name == "plan")
    said = {k: v.value for k, v in plan.event_specific_data.metadata.items()}
    assert (said["workers_asked"], said["workers"]) == (8, 1) and "only 500 rows" in said["fewer_workers_because"]


def _step_spans(instance, run_id: str) -> dict[str, float]:
    """Each step's seconds from its start to its success, as Dagster recorded them."""
    starts = {e.step_key: e.timestamp for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_START)}
    return {e.step_key: e.timestamp - starts[e.step_key]
            for e in instance.all_logs(run_id, of_type=DagsterEventType.STEP_SUCCESS)}


def _code_server_version(monkeypatch) -> str:
    """The Function's version as a process other than the run's computes it (the code server's)."""
    import importlib.util

    from gpufn_dagster import function_of

    spec = importlib.util.spec_from_file_location("fanout_defs_here", DEFS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return function_of(module.shout_asset).version
