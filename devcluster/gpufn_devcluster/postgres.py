"""A real PostgreSQL server on this machine, for Dagster instances stored the way a Kubernetes
deployment stores them (dagster-postgres: runs, events, schedules, concurrency pools).

Debian's `postgresql` package gives the binaries; one server runs in a temporary directory, bound
to 127.0.0.1 on a free port, with durability traded for speed (`fsync=off`: a test database is
thrown away), and each instance gets a database of its own (`database()`). PostgreSQL refuses to
run as root, so as root (CI) the server runs as the package's `postgres` user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from .processes import ClusterError, free_port, retry_port_clash, start, stop_all, wait_ready

PACKAGE_DIR = Path("/usr/lib/postgresql")  # Debian's: /usr/lib/postgresql/<major>/bin
SERVER_USER = "postgres"  # the package's system user, for a server started as root


def bin_dir() -> Path:
    """The newest installed PostgreSQL's binaries; ClusterError naming the package when there is none."""
    found = sorted(PACKAGE_DIR.glob("*/bin/postgres"), key=lambda p: int(p.parent.parent.name)
                   if p.parent.parent.name.isdigit() else 0)
    if not found:
        raise ClusterError(f"no PostgreSQL server under {PACKAGE_DIR}: apt-get install -y postgresql")
    return found[-1].parent


def _as_server_user() -> list[str]:
    """The command prefix that drops root to the package's user (nothing when not root)."""
    if os.geteuid() != 0:
        return []
    # setpriv sets the parent-death signal again after the change of user, which clears it.
    return ["setpriv", f"--reuid={SERVER_USER}", f"--regid={SERVER_USER}", "--init-groups", "--pdeathsig", "KILL", "--"]


@dataclass
class Postgres:
    """A running PostgreSQL server; use as a context manager or call start()/stop().

    Example:
        >>> with Postgres() as server:  # doctest: +SKIP
        ...     url = server.database()  # postgresql+psycopg2://postgres@127.0.0.1:<port>/gpufn_<hex>
        ...     storage = {"storage": {"postgres": {"postgres_url": url}}}  # a dagster.yaml section
    """

    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="gpufn-pg-")))
    port: int = 0
    processes: dict = field(default_factory=dict)

    def url(self, database: str = "postgres", driver: str = "") -> str:
        return f"postgresql{driver}://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def __enter__(self) -> Postgres:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, timeout: float = 120.0) -> None:
        """initdb a cluster in the work directory and start its server."""
        binaries, prefix = bin_dir(), _as_server_user()
        data, log = self.workdir / "data", self.workdir / "postgres.log"
        if prefix:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.workdir, user.pw_uid, user.pw_gid)
        done = subprocess.run([*prefix, binaries / "initdb", "-D", data, "-U", SERVER_USER, "--auth=trust",
                               "-E", "UTF8", "--no-sync"], capture_output=True, text=True)
        if done.returncode != 0:
            raise ClusterError(f"initdb failed ({done.returncode}):\n{done.stderr[-3000:]}")

        def launch() -> None:
            self.port = free_port()
            self.processes["postgres"] = start(
                [*prefix, binaries / "postgres", "-D", data, "-h", "127.0.0.1", "-p", self.port, "-k", self.workdir,
                 "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off",
                 "-c", "max_connections=300"], log=log, cwd=self.workdir)
            wait_ready("postgres", self.processes["postgres"], self._answers, log, timeout=timeout)

        def clean() -> None:
            stop_all(self.processes)
            self.processes.clear()

        retry_port_clash(launch, clean, "postgres")

    def _answers(self) -> bool:
        import psycopg2

        try:
            psycopg2.connect(self.url(), connect_timeout=2).close()
        except psycopg2.OperationalError:
            return False
        return True

    def database(self, name: str | None = None) -> str:
        """Create a new, empty database; returns its URL as dagster-postgres' `postgres_url` takes it.

        The URL names psycopg2, the driver dagster-postgres installs: SQLAlchemy 2.1 reads a bare
        `postgresql://` as psycopg 3, which is not installed (ModuleNotFoundError: psycopg).
        """
        import psycopg2

        name = name or f"gpufn_{uuid.uuid4().hex[:12]}"
        connection = psycopg2.connect(self.url())
        try:
            connection.autocommit = True  # CREATE DATABASE cannot run in a transaction
            with connection.cursor() as cursor:
                cursor.execute(f'CREATE DATABASE "{name}"')
        finally:
            connection.close()
        return self.url(name, driver="+psycopg2")

    def stop(self) -> None:
        stop_all(self.processes, grace=20)
        self.processes.clear()
        shutil.rmtree(self.workdir, ignore_errors=True)
