"""Every name this plugin takes from Dagster's private modules (`dagster._…`), in one place, each
with why no public API serves. Pinned with the Dagster family (==1.13.27): when a release moves
one, this is the one file to change, and `tests/unit/test_layout.py` keeps it the only importer.
"""

# A Function's spec rides on its asset as metadata that shows readable text in the UI and keeps
# the Python object for the code that reads it back; no public MetadataValue holds an object.
from dagster._core.definitions.metadata.metadata_value import ObjectMetadataValue

# The tag that gives an observation its data version: an observation reported from a sensor (not
# from an observable source asset's function) carries it only as this tag; no public name.
from dagster._core.definitions.data_version import DATA_VERSION_TAG

# The metadata of an engine event (`instance.report_engine_event`, `DagsterEvent.engine_event`),
# the only way a launcher, coordinator or sensor writes a table of facts into a run's log.
from dagster._core.events import EngineEventData

# Validating and defaulting a run's `execution.config` against k8s_job_executor's own schema, so
# gpufn's executor takes every option the executor it wraps does, with the same defaults.
from dagster._config import process_config

# The multiprocess executor's requirements (a persistent instance, a reconstructable job), which
# `dg.multiprocess_executor` declares but does not expose; gpufn's executor runs its steps the same way.
from dagster._core.definitions.executor_definition import multiple_process_executor_requirements
# The type of an executor's `retries` property (the Executor interface returns it; no public name).
from dagster._core.execution.retries import RetryMode

# What a run launcher's `launch_run` receives (`dagster_k8s.K8sRunLauncher` subclasses take it too).
from dagster._core.launcher import LaunchRunContext

# What a step handler's `launch_step` receives (`dagster_k8s.K8sStepHandler` is subclassed here).
from dagster._core.executor.step_delegating.step_handler.base import StepHandlerContext

# A run worker's entry point, as `dagster api execute_run` (what dagster-k8s runs in a run pod)
# starts one: the run, serialized as `ExecuteRunArgs`. A warm run worker (`run.warm_worker`)
# executes its run through the same function, and loads its code location ahead from the
# run's origin as Dagster's run worker will (no public API reconstructs a repository from an origin).
from dagster._core.instance.ref import InstanceRef
from dagster._core.origin import RepositoryPythonOrigin
from dagster._grpc.types import ExecuteRunArgs
from dagster._utils.hosted_user_process import recon_repository_from_origin
# What Dagster's run worker sets in its environment before its first step (its Snowflake partner
# name): a warm run worker sets it before starting its step forkserver, so the steps inherit the same.
from dagster._core.snowflake_partner import set_snowflake_partner_env_var


def reuse_alembic_scripts() -> None:
    """Make this process load each of Dagster's alembic script folders once, not at every instance it opens.

    Opening an instance checks each SQL storage's schema against the head revision of its alembic
    scripts (`dagster._core.storage.sql.check_alembic_revision`), and alembic's `ScriptDirectory`
    is built anew for every check: it executes every migration file of the folder again (88 files,
    three times for SQLite's run, event and schedule storages), about 0.45 s of CPU on this machine
    and 1.5 s with eight step processes starting at once on 2 cores -- most of a step's start. The
    head revision depends only on those installed files, so one `ScriptDirectory` per folder gives
    the same answer; a step forkserver that opened the instance once (`run.step_preload`) hands
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


__all__ = ["DATA_VERSION_TAG", "EngineEventData", "ExecuteRunArgs", "InstanceRef", "RepositoryPythonOrigin", "execute_run_main",
           "reuse_alembic_scripts",
           "recon_repository_from_origin", "set_snowflake_partner_env_var", "LaunchRunContext", "ObjectMetadataValue", "RetryMode", "StepHandlerContext",
           "multiple_process_executor_requirements", "process_config"]
