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

A code server can open no table either: given a state file (`build_definitions(schemas_state=...)`),
it reads the schemas from the file, which `gpufn refresh-state` writes out of band (a deploy step
where the tables are reachable, as `dg utils refresh-defs-state` writes a state-backed component's
state). The file is a snapshot: what a check finds wrong in it is confirmed against the tables
before the load fails (`confirmed`), so a table changed since the snapshot never fails a load
wrongly; a column dropped since passes the load and fails the refresh that reads it. A file for
another database, or none, is not used: the tables are read as without one.
"""

from __future__ import annotations

import base64
import json
import os
import warnings
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path

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


def _encoded(schemas: dict[str, pa.Schema | None]) -> dict[str, str | None]:
    return {name: None if schema is None else base64.b64encode(schema.serialize().to_pybytes()).decode()
            for name, schema in sorted(schemas.items())}


def _decoded(values: dict[str, str | None]) -> dict[str, pa.Schema | None]:
    return {name: None if value is None else pa.ipc.read_schema(pa.py_buffer(base64.b64decode(value)))
            for name, value in values.items()}


def encode(schemas: dict[str, pa.Schema | None]) -> str:
    """The schemas as text (reconstruction metadata holds strings): each table's Arrow IPC schema in
    base64, `null` for a table that did not exist.

    >>> decode(encode({"docs": pa.schema([("text", pa.string())]), "later": None}))
    {'docs': text: string, 'later': None}
    """
    return json.dumps(_encoded(schemas))


def decode(text: str) -> dict[str, pa.Schema | None]:
    """What `encode` wrote."""
    return _decoded(json.loads(text))


def write_state(path: Path, db_uri: str, schemas: dict[str, pa.Schema | None]) -> None:
    """The state file `read_state` reads: the database's URI and its tables' schemas, written whole
    (a code server starting meanwhile reads the old file or the new one, never half of one).

    >>> import tempfile
    >>> state = Path(tempfile.mkdtemp()) / "schemas.json"
    >>> write_state(state, "s3://lake/gpufn", {"docs": pa.schema([("text", pa.string())])})
    >>> read_state(state, "s3://lake/gpufn"), read_state(state, "s3://other")
    ({'docs': text: string}, None)
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"db_uri": db_uri, "schemas": _encoded(schemas)}, indent=1) + "\n")
    os.replace(partial, path)


def read_state(path: Path, db_uri: str) -> dict[str, pa.Schema | None] | None:
    """The schemas in the state file, or None: no file, one for another database, or one that does not
    read (a warning names it; the tables are then read as without a file)."""
    try:
        state = json.loads(path.read_text())
        return _decoded(state["schemas"]) if state["db_uri"] == db_uri else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        warnings.warn(f"{path}: not a schemas state file gpufn refresh-state wrote ({type(err).__name__}: {err}); "
                      "reading the tables instead", stacklevel=2)
        return None


# Set by `refreshing` (`gpufn refresh-state`): the state files written while it lasts, each with its
# database and tables.
_refreshed: ContextVar[list[tuple[Path, str, list[str]]] | None] = ContextVar("refreshed", default=None)


@contextmanager
def refreshing() -> Iterator[list[tuple[Path, str, list[str]]]]:
    """While it lasts, every `build_definitions(schemas_state=...)` reads its tables and writes its
    state file; yields the files written (path, database URI, tables)."""
    written: list[tuple[Path, str, list[str]]] = []
    token = _refreshed.set(written)
    try:
        yield written
    finally:
        _refreshed.reset(token)


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


def table_schemas(database: LanceDBResource, tables: Iterable[str],
                  state: Path | None = None) -> tuple[dict[str, pa.Schema | None], bool]:
    """The schemas of `tables`, and whether any came from the state file (a snapshot: `confirmed`
    reads them anew). As the code location's definer read them when this process reconstructs it;
    else from `state` where it has them; else read now. What is used is kept for the processes that
    will reconstruct the location."""
    wanted = set(tables)
    key = state_key(database.uri)
    kept = kept_at_definition(key)
    schemas = {name: schema for name, schema in decode(kept).items() if name in wanted} if kept else {}
    refreshed = _refreshed.get()
    from_state = False
    if state is not None and refreshed is None and not kept:
        schemas = {name: schema for name, schema in (read_state(state, database.uri) or {}).items() if name in wanted}
        from_state = bool(schemas)
    if missing := wanted - schemas.keys():
        schemas.update(read_schemas(database, missing))
    if state is not None and refreshed is not None:
        write_state(state, database.uri, schemas)
        refreshed.append((state, database.uri, sorted(schemas)))
    keep_for_reconstruction(key, encode(schemas))
    return schemas, from_state


def confirmed(database: LanceDBResource, tables: Iterable[str]) -> dict[str, pa.Schema | None]:
    """The schemas of `tables` read from the database, in place of a state file's: what a check found
    wrong in the snapshot is judged on the tables themselves (and kept so for the runs)."""
    schemas = read_schemas(database, tables)
    keep_for_reconstruction(state_key(database.uri), encode(schemas))
    return schemas
