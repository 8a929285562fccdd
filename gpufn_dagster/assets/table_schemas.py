"""The schemas of the tables a code location's Functions compute on: read once where the code
location is defined, handed to every process that reconstructs it.

Checking the definitions against their tables (`definitions.check_tables`) needs each table's
schema, and reading one opens the table: a listing and a manifest read, several round trips on an
object store. Where the code location is defined (a code server, `dagster dev`, a plain import),
each distinct table is read once, the tables side by side, so the load grows with neither the
Functions (50 Functions on one table read it once) nor, beyond one round of reads, the tables. What
was read is kept in the code location's reconstruction metadata -- Dagster's state of a definitions
load, as its state-backed definitions keep what an API answered -- so a run worker and each step
process check the same schemas without opening the database: the same answer in every process, from
the same data. A process reconstructing a code location that kept nothing (a run from before this
release; a warm worker loading ahead of any run) reads the tables as a code server does.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa

from ..private_ledger import keep_for_reconstruction, kept_at_definition
from ..tags import TABLE_SCHEMAS_KEY
from .resources import LanceDBResource

# Side-by-side reads where the code location is defined: object-store latency, not CPU, bounds them.
READERS = 16


def state_key(db_uri: str) -> str:
    """The reconstruction-metadata key of one database's schemas (a code location may use several).

    >>> state_key("s3://lake/gpufn")
    'gpufn/table_schemas:s3://lake/gpufn'
    """
    return TABLE_SCHEMAS_KEY + db_uri


def encode(schemas: dict[str, pa.Schema | None]) -> str:
    """The schemas as text (reconstruction metadata holds strings): each table's Arrow IPC schema in
    base64, `null` for a table that did not exist.

    >>> decode(encode({"docs": pa.schema([("text", pa.string())]), "later": None}))
    {'docs': text: string, 'later': None}
    """
    return json.dumps({name: None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()
                       for name, schema in sorted(schemas.items())})


def decode(text: str) -> dict[str, pa.Schema | None]:
    """What `encode` wrote."""
    return {name: None if value is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value)))
            for name, value in json.loads(text).items()}


def read_schemas(database: LanceDBResource, tables: Iterable[str]) -> dict[str, pa.Schema | None]:
    """Each table's schema (None: no such table), one listing of the database and one open per table,
    side by side."""
    wanted = sorted(set(tables))
    if not wanted:
        return {}
    db = database.connect()
    names = database.table_names(db)
    existing = [name for name in wanted if name in names]
    with ThreadPoolExecutor(max_workers=min(READERS, max(1, len(existing)))) as pool:
        read = dict(zip(existing, pool.map(lambda name: db.open_table(name).schema, existing)))
    return {name: read.get(name) for name in wanted}


def table_schemas(database: LanceDBResource, tables: Iterable[str]) -> dict[str, pa.Schema | None]:
    """The schemas of `tables`: as the code location's definer read them when this process
    reconstructs it, else read now (and kept for the processes that will reconstruct it)."""
    wanted = set(tables)
    key = state_key(database.uri)
    kept = kept_at_definition(key)
    schemas = {name: schema for name, schema in decode(kept).items() if name in wanted} if kept else {}
    if missing := wanted - schemas.keys():
        schemas.update(read_schemas(database, missing))
    keep_for_reconstruction(key, encode(schemas))
    return schemas
