"""Whether a run and its re-executions have all ended: what lets a later run take over the lease a
killed fanned-out run left behind.

A fanned-out refresh holds its column's lease across its steps under its run's family (the first
run's id: a re-execution from failure goes on with the same refresh, `fanout_asset._token`), and no
process holds it between steps, so a run killed mid-refresh leaves it for `FANOUT_LEASE_SECONDS`.
Once Dagster says the whole family has ended (failed, canceled, or succeeded) no step of it can
come back to the lease, and a new run takes it over at once, adopting the parts it saved.
"""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg

from ..private_ledger import ROOT_RUN_ID_TAG


def family_ended(instance: dg.DagsterInstance) -> Callable[[str], bool]:
    """`ended(token)`: the run `token` and every re-execution of it have ended. False for a token
    that is no run of this instance (another deployment's, or a refresh outside Dagster): its lease
    expires as leases do."""

    def ended(token: str) -> bool:
        first = instance.get_run_by_id(token)
        if first is None:
            return False
        family = instance.get_runs(dg.RunsFilter(tags={ROOT_RUN_ID_TAG: token}))
        return all(run.is_finished for run in (first, *family))

    return ended
