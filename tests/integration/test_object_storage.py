"""Tables on object storage: a Function refresh on the suite's S3 server (SeaweedFS) configured
through `LanceDBResource.storage_options`, with the secret given as a `dg.EnvVar`, keeps that
secret out of everything Dagster stores; and the engine's files live beside the table."""

from __future__ import annotations

import dagster as dg
import lancedb
import pyarrow as pa
import pytest
from dagster._core.test_utils import instance_for_test

from gpufn_dagster import LanceDBResource, build_definitions, gpu_function
from gpufn_dagster.refresh.files import TableFiles
from gpufn_dagster.assets.resources import STABLE_ROW_IDS

pytestmark = pytest.mark.s3


def shout(text: str) -> str:
    return text.upper()


def test_storage_options_reach_every_reader_and_the_secret_reaches_no_event(object_store, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(name, raising=False)  # only the resource's options reach the store
    monkeypatch.setenv("LAKE_SECRET", object_store.secret_key)
    options = {k: v for k, v in object_store.storage_options.items() if k != "aws_secret_access_key"}
    db_uri = object_store.uri(f"options-{tmp_path.name}")
    lancedb.connect(db_uri, storage_options=object_store.storage_options).create_table(
        "docs", pa.table({"id": list(range(300)), "text": [f"doc {i}" for i in range(300)]}),
        storage_options=STABLE_ROW_IDS)
    asset = gpu_function(table="docs", column="shout", checkpoint_seconds=0)(shout)
    defs = build_definitions(assets=[asset], db_uri=db_uri, storage_options=object_store.storage_options)
    resource = LanceDBResource(uri=db_uri, storage_options={**options, "aws_secret_access_key": dg.EnvVar("LAKE_SECRET")})

    (tmp_path / "home").mkdir()
    with instance_for_test(temp_dir=str(tmp_path / "home")) as instance:
        result = dg.materialize([asset], resources={**defs.resources, "lancedb": resource}, instance=instance)
        assert result.success
        records = instance.get_event_records(dg.EventRecordsFilter(dg.DagsterEventType.ASSET_MATERIALIZATION))
        assert records[0].asset_materialization.metadata["rows_computed"].value == 300
        stored = [str(entry) for entry in instance.all_logs(result.run_id)]
        stored.append(str(instance.get_run_by_id(result.run_id)))
    assert stored and not any(object_store.secret_key in text for text in stored)
    assert all(object_store.secret_key not in path.read_bytes().decode(errors="replace")
               for path in (tmp_path / "home").rglob("*") if path.is_file())

    files = TableFiles(f"{db_uri}/docs.lance", object_store.storage_options)
    values = files.dataset().to_table(columns=["id", "shout"]).to_pydict()
    assert values["shout"][7] == "DOC 7" and None not in values["shout"]
    # Checkpoints went to the store and were cleared after the commit; the lease was released.
    assert files.names("_gpufn/checkpoints") == [] and files.names("_gpufn/leases") == []
    assert files.names("_gpufn/state") == ["_gpufn_sig_shout.json"]
