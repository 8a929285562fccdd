"""Where a test's tables can live: `@pytest.mark.parametrize("db_uri", STORAGES, indirect=True)`
runs it once on a local directory and once on the suite's object store (see `db_uri` in conftest)."""

import pytest

STORAGES = [pytest.param("local", id="local"), pytest.param("s3", id="s3", marks=pytest.mark.s3)]
