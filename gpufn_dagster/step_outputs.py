"""Where the steps of a refresh spread over several workers hand each other their values.

The plan step's shards go to shard steps, and the shards' reports to the commit step. With
`k8s_job_executor` each step is its own pod, so Dagster's default IO manager (the run worker's
local disk) cannot carry them; they are kept beside the LanceDB database instead, on the same
storage every worker already reaches (`<db>/_gpufn_runs/<run id>/<step>/<output>.pickle`), and the
commit step removes its run's folder. `build_definitions` provides it as `gpufn_step_outputs`.
"""


import pickle
import re

import dagster as dg

from .refresh.files import TableFiles
from .resources import LanceDBResource

STEP_OUTPUTS_KEY = "gpufn_step_outputs"


def _runs(lancedb: LanceDBResource) -> TableFiles:
    return TableFiles(f"{lancedb.uri.rstrip('/')}/_gpufn_runs", lancedb.storage_options)


def _name(identifier: list[str]) -> str:
    return "/".join(re.sub(r"[^A-Za-z0-9_.-]", "_", part) for part in identifier) + ".pickle"


class StepOutputsIOManager(dg.ConfigurableIOManager):
    """Keeps step outputs on the database's storage, so step pods on different nodes share them."""

    lancedb: LanceDBResource

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
