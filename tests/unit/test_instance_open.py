"""A step process opens the run's instance; with `reuse_alembic_scripts` (what the step forkserver
and a warm run worker call) the schema checks load Dagster's alembic scripts once per process, not
at every open, and give the same answer as without it, in another process."""

from __future__ import annotations

import json
import subprocess
import sys

OPEN_TWICE = """
import json, sys
from alembic.script import ScriptDirectory
from dagster import DagsterInstance
from gpufn_dagster.private_ledger import reuse_alembic_scripts

loads = []
real = ScriptDirectory._load_revisions
def counted(self):
    loads.append(self.dir)
    return real(self)
ScriptDirectory._load_revisions = counted
if sys.argv[2] == "reuse":
    reuse_alembic_scripts()
counts, versions = [], []
for _ in range(2):
    with DagsterInstance.local_temp(sys.argv[1]) as instance:
        versions.append([list(instance.run_storage.alembic_version()), list(instance.event_log_storage.alembic_version())])
    counts.append(len(loads))
print(json.dumps({"counts": counts, "versions": versions}))
"""


def _open_twice(home: str, mode: str) -> dict:
    done = subprocess.run([sys.executable, "-c", OPEN_TWICE, home, mode], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


def test_an_instance_opened_again_reuses_the_loaded_alembic_scripts_and_checks_the_same_schema(tmp_path):
    (tmp_path / "home").mkdir()
    reused = _open_twice(str(tmp_path / "home"), "reuse")
    first, second = reused["counts"]
    assert first >= 1 and second == first  # the second open loaded no script folder again
    fresh = _open_twice(str(tmp_path / "home"), "fresh")
    assert fresh["counts"][1] > fresh["counts"][0]  # without it, every open loads them again
    # The same (database revision, head revision) of each storage, up to date, in both processes.
    assert reused["versions"] == fresh["versions"] == [reused["versions"][0]] * 2
    assert all(head and db == head for db, head in reused["versions"][0])
