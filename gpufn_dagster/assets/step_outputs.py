"""Where the steps of a refresh spread over several workers hand each other their values.

The plan step's shards go to shard steps, and the shards' reports to the commit step. On
Kubernetes each step of a fanned-out run is its own pod (gpufn's executor's step pods), so Dagster's default IO manager (the run worker's
local disk) cannot carry them; they are kept beside the LanceDB database instead, on the same
storage every worker already reaches (`<db>/_gpufn_runs/<run id>/<step>/<output>.pickle`), and the
commit step removes its run's folder. Each fanned-out asset brings it along (`resource_defs`).
"""


import pickle
import re

import dagster as dg

from ..refresh.files import TableFiles
from .resources import LanceDBResource

STEP_OUTPUTS_KEY = "gpufn_step_outputs"


def _runs(lancedb: LanceDBResource) -> TableFiles:
    return TableFiles(f"{lancedb.uri.rstrip('/')}/_gpufn_runs", lancedb.storage_options)


def _name(identifier: list[str]) -> str:
    return "/".join(re.sub(r"[^A-Za-z0-9_.-]", "_", part) for part in identifier) + ".pickle"


class StepOutputsIOManager(dg.IOManager):
    """Keeps step outputs on the database's storage, so step pods on different nodes share them."""

    def __init__(self, lancedb: LanceDBResource):
        self.lancedb = lancedb

    def handle_output(self, context: dg.OutputContext, obj: object) -> None:
        _runs(self.lancedb).write(_name(context.get_identifier()), pickle.dumps(obj))

    def load_input(self, context: dg.InputContext) -> object:
        data = _runs(self.lancedb).read(_name(context.upstream_output.get_identifier()))
        if data is None:
            raise FileNotFoundError(f"{self.lancedb.uri}/_gpufn_runs: no output {context.upstream_output.name!r} of "
                                    f"step {context.upstream_output.step_key!r}")
        return pickle.loads(data)

    def forget_run(self, run_id: str) -> None:
        """Remove what the run's steps handed each other (after its commit)."""
        _runs(self.lancedb).delete_folder(run_id)


@dg.io_manager(required_resource_keys={"lancedb"},
               description="Step outputs of fanned-out refreshes, kept beside the LanceDB database.")
def step_outputs_io_manager(init_context: dg.InitResourceContext) -> StepOutputsIOManager:
    """The IO manager a fanned-out Function asset brings along (its ops' `io_manager_key`), built on
    the definitions' own `lancedb` resource, so nothing else has to be configured."""
    return StepOutputsIOManager(init_context.resources.lancedb)
