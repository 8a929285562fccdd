"""The LanceDB connection Functions and views refresh through, as a Dagster resource."""

from __future__ import annotations

import os
from datetime import timedelta

import dagster as dg
import lancedb
from pydantic import Field

from .errors import TableNotFound

DB_URI_ENV = "GPUFN_LANCEDB_URI"
DEFAULT_DB_URI = ".gpufn_data/lancedb"
# Stable row ids let materialized views follow source rows across compaction and updates.
STABLE_ROW_IDS = {"new_table_enable_stable_row_ids": "true"}


def default_db_uri() -> str:
    return os.environ.get(DB_URI_ENV, DEFAULT_DB_URI)


class LanceDBResource(dg.ConfigurableResource):
    """A LanceDB database (a local directory in the embedded default)."""

    uri: str = Field(default_factory=default_db_uri, description="LanceDB URI; a local path in embedded mode")

    def connect(self) -> lancedb.DBConnection:
        # read_consistency_interval=0: always see commits made by other processes (refresh workers).
        return lancedb.connect(self.uri, read_consistency_interval=timedelta(0))

    def table_uri(self, name: str) -> str:
        db = self.connect()
        try:
            return db.open_table(name).to_lance().uri
        except ValueError as err:
            raise TableNotFound(f"LanceDB {self.uri}: no table {name!r}; materialize its source asset first") from err
