"""The LanceDB connection Functions and views refresh through, as a Dagster resource."""

from __future__ import annotations

import os
from datetime import timedelta

import dagster as dg
import lancedb
from pydantic import Field

from ..errors import TableNotFound
from ..refresh.files import TableFiles

DB_URI_ENV = "GPUFN_LANCEDB_URI"
DEFAULT_DB_URI = ".gpufn_data/lancedb"
# Stable row ids let materialized views follow source rows across compaction and updates.
STABLE_ROW_IDS = {"new_table_enable_stable_row_ids": "true"}


def default_db_uri() -> str:
    return os.environ.get(DB_URI_ENV, DEFAULT_DB_URI)


class LanceDBResource(dg.ConfigurableResource):
    """A LanceDB database: a local directory in the embedded default, or a folder of an object
    store (`s3://bucket/db`, `gs://`, `az://`) on Kubernetes, where a worker's disk ends with its pod.

    Every reader and writer of the plugin goes through it: refreshes (and their checkpoints and
    leases, kept beside each table), views, sensors, checks and the errors table.

    Args:
        uri: the database; default `$GPUFN_LANCEDB_URI`, else `.gpufn_data/lancedb`.
        storage_options: how to reach an object store, as Lance takes them (`aws_endpoint`,
            `aws_region`, `allow_http`, ...). Keep secrets out of code: give them as
            `dg.EnvVar`, or leave them out and set `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
            (and `AWS_ENDPOINT_URL`, `AWS_REGION`) in the pod's environment from a Secret; the
            store reads those itself.

    Example:
        >>> db = LanceDBResource(uri="s3://lake/gpufn", storage_options={
        ...     "aws_endpoint": "http://seaweedfs.storage:8333", "aws_region": "us-east-1", "allow_http": "true"})
        >>> db.storage_options["aws_region"]
        'us-east-1'
    """

    uri: str = Field(default_factory=default_db_uri, description="LanceDB URI: a local path, or s3://bucket/folder")
    storage_options: dict[str, str] = Field(
        default_factory=dict, description="object-store settings as Lance takes them (endpoint, region, "
                                          "credentials); empty reads the AWS_* environment variables")

    def connect(self) -> lancedb.DBConnection:
        # read_consistency_interval=0: always see commits made by other processes (refresh workers).
        return lancedb.connect(self.uri, read_consistency_interval=timedelta(0),
                               storage_options=self.storage_options or None)

    def table_names(self, db: lancedb.DBConnection | None = None) -> set[str]:
        """Every table of the database (each page `list_tables` answers, followed to the last);
        `db` reuses a connection the caller has open."""
        db = db or self.connect()
        names: set[str] = set()
        token = None
        while True:
            page = db.list_tables(page_token=token)
            names.update(page.tables)
            token = page.page_token
            if not token or not page.tables:
                return names

    def table_files(self, name: str) -> TableFiles:
        """The table `name` of this database and the engine's files beside it (`TableNotFound` if none)."""
        return TableFiles(self.open_table(name).to_lance().uri, self.storage_options)

    def open_table(self, name: str) -> lancedb.table.Table:
        """The table, or a `TableNotFound` that says to materialize its source first."""
        try:
            return self.connect().open_table(name)
        except ValueError as err:
            raise TableNotFound(f"LanceDB {self.uri}: no table {name!r}; materialize its source asset first") from err
