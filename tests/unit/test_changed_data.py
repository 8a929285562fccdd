"""Which Lance commits a table sensor counts as changed data: its own refreshes are not."""

from __future__ import annotations

from gpufn_dagster.assets.changed_partitions import changed_data


def test_changed_data_classifies_commits():
    assert not changed_data([("DataReplacement", "gpufn refresh docs__up version x"), ("Merge", ""),
                             ("Rewrite", ""), ("CreateIndex", "")])
    assert changed_data([("Append", "")]) and changed_data([("Update", "")]) and changed_data([("Delete", "")])
    assert changed_data([("DataReplacement", "")])  # someone else's column values may be an input
