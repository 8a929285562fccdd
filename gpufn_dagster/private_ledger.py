"""The one ledger of every reach into a library's private parts: the names taken from Dagster's
private modules (`dagster._…`), and the private attributes, methods, re-implemented CLI entry points
and patches of Dagster, dagster-k8s, lancedb and CPython's multiprocessing this plugin uses, each
with why no public API serves and what breaks it.

The pins (the Dagster family ==1.13.27, dagster-k8s ==0.29.27, lancedb exactly, CPython 3.11) hold
runtime behaviour here, not only names: `REACHES` lists each reach with a check that says, in one
line, what a new release changed under it (`tests/unit/test_private_ledger.py` runs them), so an
upgrade fails with that line rather than with a wrong behaviour. `tests/unit/test_layout.py` keeps
this module the only importer of `dagster._…` and the only reader of another library's private
attributes.
"""

from __future__ import annotations

import inspect
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dagster import DagsterInstance

# A Function's spec rides on its asset as metadata that shows readable text in the UI and keeps
# the Python object for the code that reads it back; no public MetadataValue holds an object.
from dagster._core.definitions.metadata.metadata_value import ObjectMetadataValue

# The tag that gives an observation its data version: an observation reported from a sensor (not
# from an observable source asset's function) carries it only as this tag; no public name.
from dagster._core.definitions.data_version import DATA_VERSION_TAG

# The metadata of an engine event (`instance.report_engine_event`, `DagsterEvent.engine_event`),
# the only way a launcher, coordinator or sensor writes a table of facts into a run's log.
from dagster._core.events import EngineEventData

# The tag Dagster gives every re-execution of a run, naming the first run of the family (the token
# of a fanned-out refresh's lease, `assets.run_family`); runs are listed by it, and no public name has it.
from dagster._core.storage.tags import ROOT_RUN_ID_TAG

# Validating and defaulting a run's `execution.config` against k8s_job_executor's own schema, so
# gpufn's executor takes every option the executor it wraps does, with the same defaults.
from dagster._config import process_config

# The type of an executor's `retries` property (the Executor interface returns it; no public name).
from dagster._core.execution.retries import RetryMode

# What a run launcher's `launch_run` receives (`dagster_k8s.K8sRunLauncher` subclasses take it too).
from dagster._core.launcher import LaunchRunContext

# What a step handler's `launch_step` receives (`dagster_k8s.K8sStepHandler` is subclassed here).
from dagster._core.executor.step_delegating.step_handler.base import StepHandlerContext

# A run worker's entry point, as `dagster api execute_run` (what dagster-k8s runs in a run pod)
# starts one: the run, serialized as `ExecuteRunArgs`. A warm run worker (`embedded.warm_worker`)
# executes its run through the same function, and loads its code location ahead from the
# run's origin as Dagster's run worker will (no public API reconstructs a repository from an origin).
from dagster._core.instance.ref import InstanceRef
from dagster._core.origin import RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._utils.hosted_user_process import recon_repository_from_origin
# ... with the load data its code server kept for the run (`execute_run` reads it from the run's
# execution plan snapshot; a warm run worker loads with the same, so it reads no table again).
from dagster._core.definitions.repository_definition import RepositoryLoadData
# What Dagster's run worker sets in its environment before its first step (its Snowflake partner
# name): a warm run worker sets it before starting its step forkserver, so the steps inherit the same.
from dagster._core.snowflake_partner import set_snowflake_partner_env_var
# What a code server read while defining the code location, kept for the processes that reconstruct
# it (a run worker, its step processes): Dagster's reconstruction metadata, as its state-backed
# definitions use it; the load context is not exported (`Definitions.with_reconstruction_metadata`
# is, but only writes, and only onto a Definitions object).
from dagster._core.definitions.definitions_load_context import DefinitionsLoadContext, DefinitionsLoadType


def reuse_alembic_scripts() -> None:
    """Make this process load each of Dagster's alembic script folders once, not at every instance it opens.

    Opening an instance checks each SQL storage's schema against the head revision of its alembic
    scripts (`dagster._core.storage.sql.check_alembic_revision`), and alembic's `ScriptDirectory`
    is built anew for every check: it executes every migration file of the folder again (88 files,
    three times for SQLite's run, event and schedule storages), about 0.45 s of CPU on this machine
    and 1.5 s with eight step processes starting at once on 2 cores -- most of a step's start. The
    head revision depends only on those installed files, so one `ScriptDirectory` per folder gives
    the same answer; a step forkserver that opened the instance once (`embedded.step_preload`) hands
    every step it forks the loaded revisions. Affects only the schema checks of `check_alembic_revision`
    (upgrades and stamps build their own), in the processes that call this.
    """
    from alembic.script import ScriptDirectory

    import dagster._core.storage.sql as sql

    if sql.ScriptDirectory is not ScriptDirectory:
        return
    loaded: dict[str | None, ScriptDirectory] = {}

    class ReusedScriptDirectory(ScriptDirectory):
        @classmethod
        def from_config(cls, config, *args, **kwargs):  # noqa: ANN001, ANN206 -- alembic's signature
            location = config.get_main_option("script_location")
            if location not in loaded:
                loaded[location] = ScriptDirectory.from_config(config, *args, **kwargs)
            return loaded[location]

    sql.ScriptDirectory = ReusedScriptDirectory


def execute_run_main(input_json: str) -> None:
    """`dagster api execute_run <input_json>`'s body (imported when called: its module costs a
    quarter of a second that every other importer of this module would pay)."""
    from dagster._cli.api import execute_run_command

    execute_run_command.callback(input_json, None)


class HoldsInstance:
    """A run launcher's or coordinator's instance as `instance`: Dagster hands it to them only as
    the private `_instance` of `MayHaveInstanceWeakref` (its own launchers read it so)."""

    @property
    def instance(self) -> DagsterInstance:
        return self._instance  # type: ignore[attr-defined]


def note_launched(launcher: Any, run_id: str) -> None:
    """Count a run as `DefaultRunLauncher`'s own, as its `launch_run` does, for one started in a warm
    run worker: its `terminate` and `join` go by the private `_run_ids` set."""
    launcher._run_ids.add(run_id)


def k8s_api_host(launcher: Any) -> str:
    """The Kubernetes API's address a `K8sRunLauncher` talks to, for error messages: its client
    (`_api_client`) is private, and no public attribute names the host."""
    return launcher._api_client.batch_api.api_client.configuration.host


def adopt_step_handler(handler: Any, cls: type) -> Any:
    """An instance of `cls` (a `K8sStepHandler` subclass) holding `handler`'s state whole: the client,
    image and config layers `k8s_job_executor` configured it with, none rebuilt differently (its
    constructor takes them only in an order private to the executor's factory)."""
    adopted = cls.__new__(cls)
    adopted.__dict__.update(vars(handler))
    return adopted


def step_key_of(handler: Any, step_handler_context: Any) -> str:
    """The one step a `K8sStepHandler` call is about (its private `_get_step_key`)."""
    return handler._get_step_key(step_handler_context)


def udf_function(target: Any) -> Any:
    """The function a `lancedb.udf` definition wraps (its private `_function`), or None."""
    return getattr(target, "_function", None)


def data_file_path(data_file: Any) -> str:
    """A Lance `DataFile`'s path (its private `_path`): the public `path` property builds a new
    `str` subclass on every read (a backward-compatible callable), 4 us a file, which a plan
    reading 1,000 fragments' files twice each pays for in full; `_path` is the same string."""
    return data_file._path


def stop_forkserver() -> None:
    """Kill and forget this process's multiprocessing forkserver: multiprocessing keeps one per
    process and has no public way to stop it; `ForkServer._stop` and its pid are what CPython's own
    tests use. Killed, not asked: one still importing its preloads would only hear the request once done."""
    import multiprocessing.forkserver

    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid is not None:
        os.kill(server._forkserver_pid, signal.SIGKILL)
    server._stop()


def kept_at_definition(key: str) -> str | None:
    """What the process that defined this code location kept under `key` (`keep_for_reconstruction`),
    in a process reconstructing it (a run worker, a step process); None in one defining it (a code
    server, `dagster dev`, a plain import) or when nothing was kept."""
    context = DefinitionsLoadContext.get()
    if context.load_type != DefinitionsLoadType.RECONSTRUCTION:
        return None
    return context.reconstruction_metadata.get(key)


def keep_for_reconstruction(key: str, value: str) -> None:
    """Keep `value` in the code location's reconstruction metadata under `key`: the run workers and
    step processes of its runs find it with `kept_at_definition`. Outside a definitions load (a plain
    import) there is no code location to keep it in, and nothing is kept."""
    DefinitionsLoadContext.get().add_to_pending_reconstruction_metadata(key, value)


@dataclass(frozen=True)
class Reach:
    """One reach into a library's private parts: what, where, why, what breaks, and its check."""

    library: str
    what: str
    used_by: str
    why: str
    check: Callable[[], bool]


def _resolve(obj_path: str) -> Any:
    """`module:Attr.attr` imported and looked up."""
    import importlib

    module, _, attribute = obj_path.partition(":")
    value: Any = importlib.import_module(module)
    for part in filter(None, attribute.split(".")):
        value = getattr(value, part)
    return value


def _has(obj_path: str, *names: str) -> Callable[[], bool]:
    """A check that `obj_path` (`module:Attr.attr`) has every one of `names`."""
    return lambda: all(hasattr(_resolve(obj_path), name) for name in names)


def _source_says(obj_path: str, *words: str) -> Callable[[], bool]:
    """A check that the source of `obj_path` still contains each of `words` (a behaviour relied on)."""
    return lambda: all(word in inspect.getsource(_resolve(obj_path)) for word in words)


def _instance_weakref() -> bool:
    from dagster._core.instance import MayHaveInstanceWeakref

    return isinstance(inspect.getattr_static(MayHaveInstanceWeakref, "_instance"), property)


def _forkserver_private() -> bool:
    import multiprocessing.forkserver

    server = multiprocessing.forkserver._forkserver
    return hasattr(server, "_forkserver_pid") and callable(getattr(server, "_stop", None))


def _data_file_keeps_path() -> bool:
    from lance.fragment import DataFile

    probe = DataFile("part.lance", [0])
    return probe._path == "part.lance" == str(probe.path)


def _udf_keeps_function() -> bool:
    import lancedb

    @lancedb.udf
    def probe(x: int) -> int:
        return x

    return getattr(probe, "_function", None) is not None


REACHES: tuple[Reach, ...] = (
    Reach("dagster", "MayHaveInstanceWeakref._instance (HoldsInstance.instance)",
          "embedded.coordinator, embedded.launcher, run.k8s.launcher",
          "a run launcher or coordinator is handed its instance only there", _instance_weakref),
    Reach("dagster", "DefaultRunLauncher._run_ids (note_launched)", "embedded.launcher",
          "a run a warm worker started is the launcher's to terminate and join",
          _source_says("dagster._core.launcher.default_run_launcher:DefaultRunLauncher", "self._run_ids")),
    Reach("dagster", "dagster._cli.api.execute_run_command (execute_run_main)", "embedded.warm_worker",
          "a warm run worker runs its run exactly as `dagster api execute_run` does",
          _has("dagster._cli.api:execute_run_command", "callback")),
    Reach("dagster", "dagster._core.storage.sql.ScriptDirectory patched (reuse_alembic_scripts)",
          "embedded.step_preload, the run worker",
          "each instance open re-executes alembic's 88 migration files; the head revision depends on them only",
          _source_says("dagster._core.storage.sql:check_alembic_revision", "ScriptDirectory.from_config")),
    Reach("dagster-k8s", "K8sRunLauncher._api_client (k8s_api_host)", "run.k8s.launcher",
          "an API error names the host it could not reach", _source_says("dagster_k8s.launcher:K8sRunLauncher",
                                                                         "self._api_client")),
    Reach("dagster-k8s", "K8sStepHandler state copied whole (adopt_step_handler)", "run.k8s.pods",
          "a GPU step handler keeps every layer k8s_job_executor configured",
          _source_says("dagster_k8s.executor:k8s_job_executor", "K8sStepHandler(")),
    Reach("dagster-k8s", "K8sStepHandler._get_step_key (step_key_of) and _get_container_context (overridden)",
          "run.k8s.pods", "the decided placement is applied as the last config layer of a step pod",
          _source_says("dagster_k8s.executor:K8sStepHandler.launch_step", "self._get_container_context(",
                       "self._get_step_key(")),
    Reach("lancedb", "a udf's _function (udf_function)", "function_spec.target",
          "a Function declared with lancedb.udf computes with the function it wraps", _udf_keeps_function),
    Reach("dagster", "DefinitionsLoadContext: load_type, reconstruction_metadata, add_to_pending_reconstruction_metadata "
          "(kept_at_definition, keep_for_reconstruction)", "assets.table_schemas",
          "the tables' schemas a code server read are checked again in run workers and steps without opening a table",
          _has("dagster._core.definitions.definitions_load_context:DefinitionsLoadContext", "load_type",
               "reconstruction_metadata", "add_to_pending_reconstruction_metadata", "get_pending_reconstruction_metadata")),
    Reach("dagster", "RepositoryLoadData; ReconstructableRepository.with_repository_load_data", "embedded.warm_worker",
          "a warm run worker loads its code location with what the code server kept, opening no table it read",
          _has("dagster._core.definitions.reconstruct:ReconstructableRepository", "with_repository_load_data")),
    Reach("pylance", "DataFile._path (data_file_path)", "refresh.plan",
          "a plan reads each fragment's file paths twice; the public property costs 20x the attribute",
          _data_file_keeps_path),
    Reach("CPython", "multiprocessing.forkserver._forkserver, ._forkserver_pid, ._stop() (stop_forkserver)",
          "embedded.forkserver", "a forkserver started ahead that no longer fits the run is stopped",
          _forkserver_private),
)


__all__ = ["DATA_VERSION_TAG", "ROOT_RUN_ID_TAG", "EngineEventData", "ExecuteRunArgs", "InstanceRef", "RepositoryLoadData", "RepositoryPythonOrigin", "execute_run_main",
           "reuse_alembic_scripts",
           "recon_repository_from_origin", "set_snowflake_partner_env_var", "LaunchRunContext", "ObjectMetadataValue", "RetryMode", "StepHandlerContext",
           "process_config", "HoldsInstance", "note_launched",
           "k8s_api_host", "adopt_step_handler", "kept_at_definition", "keep_for_reconstruction", "step_key_of", "udf_function", "data_file_path", "stop_forkserver", "Reach", "REACHES"]
