"""A Function's version is the same in every process that computes or checks it: the code server,
the run worker, a CPU pod and a GPU pod, `python file.py` and `python -m package.module`, whatever
their environment variables and import paths. It depends on the code and what the code says,
never on the values a process happens to hold (its pid, what it read from its environment, whether
it saw a GPU), nor on the module's import name."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

from gpufn_dagster import make_function

UDF = '''
import os
from pkg.helpers import OFFSET
DEVICE = "cuda" if os.environ.get("GPUFN_TEST_DEVICE") else "cpu"
STARTED_BY = os.getpid()
SUFFIX = "!"


def embed(text: str) -> str:
    return f"{text}{SUFFIX}{DEVICE}{STARTED_BY}{OFFSET}"


if __name__ == "__main__":
    from gpufn_dagster import make_function
    print(make_function(embed, table="t", column="c").version)
'''
IMPORTED = ("import pkg.udf as u; from gpufn_dagster import make_function; "
            "print(make_function(u.embed, table='t', column='c').version)")


def project(root: Path, udf: str = UDF, offset: int = 3) -> Path:
    (root / "pkg").mkdir(parents=True, exist_ok=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "helpers.py").write_text(f"OFFSET = {offset}\n")
    (root / "pkg" / "udf.py").write_text(textwrap.dedent(udf))
    return root


def version(args: list[str], cwd: Path, **env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "GPUFN_TEST_DEVICE")}
    done = subprocess.run([sys.executable, *args], cwd=cwd, env={**clean, **env}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()[-1]


def test_the_version_is_the_same_in_processes_with_other_environments_and_import_paths(tmp_path):
    root = project(tmp_path / "proj")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    versions = {
        "imported, a GPU visible": version(["-c", IMPORTED], root, GPUFN_TEST_DEVICE="1"),
        "imported, no GPU": version(["-c", IMPORTED], root),
        "python pkg/udf.py": version(["pkg/udf.py"], root, PYTHONPATH=str(root)),
        "python -m pkg.udf": version(["-m", "pkg.udf"], root),
        "from another directory, on PYTHONPATH": version(["-c", IMPORTED], elsewhere, PYTHONPATH=str(root)),
    }
    assert len(set(versions.values())) == 1, versions  # the pid and the environment differ in each

    # What the code says still counts: the expression that binds a global, a literal, an imported constant.
    def changed(**edit) -> str:
        other = project(tmp_path / f"proj-{len(list(tmp_path.iterdir()))}", **edit)
        return version(["-c", IMPORTED], other)
    first = versions["imported, no GPU"]
    assert changed(udf=UDF.replace('else "cpu"', 'else "mps"')) != first
    assert changed(udf=UDF.replace('SUFFIX = "!"', 'SUFFIX = "?"')) != first
    assert changed(offset=4) != first
    assert changed() == first  # the same project in another directory: the same version


def test_digests_made_by_many_threads_at_once_are_all_the_same(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(project(tmp_path / "proj")))
    for name in ("pkg", "pkg.udf", "pkg.helpers"):
        sys.modules.pop(name, None)
    import pkg.udf  # noqa: PLC0415 -- the project made above

    results: list[str] = []
    errors: list[BaseException] = []

    def digest() -> None:
        try:
            for _ in range(20):
                results.append(make_function(pkg.udf.embed, table="t", column="c").version)
        except BaseException as err:  # SystemError from the AST builder was seen without the lock
            errors.append(err)
    threads = [threading.Thread(target=digest) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors and len(results) == 160 and len(set(results)) == 1
    for name in ("pkg", "pkg.udf", "pkg.helpers"):
        sys.modules.pop(name, None)
