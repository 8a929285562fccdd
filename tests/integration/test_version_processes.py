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
import time
from pathlib import Path

from gpufn_dagster import build_definitions, gpu_function, make_function
from gpufn_dagster.function_spec import code_version

from ..conftest import REPO
from ..helpers import make_docs

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


# A module as large as a real model's (many definitions), a class Function in it and a row Function:
# `inspect.getsource` of the class parses the whole file, a long conversion into `ast` objects.
BIG_UDFS = "".join(f"def helper_{i}(x):\n    return [x + {i} for _ in range(3)] if x else {{'a': (x, {i})}}\n\n\n"
                   for i in range(600)) + textwrap.dedent("""
    SUFFIX = "!"


    class Embed:
        def __init__(self, suffix: str = SUFFIX):
            self.suffix = suffix

        def __call__(self, text: str) -> str:
            return helper_1(len(text)) and text + self.suffix


    def shout(text: str) -> str:
        return text.upper() + SUFFIX
""")


class _Finalized:
    """Cyclic garbage with a finalizer, as a Dagster process makes plenty of: the collector runs
    its Python code in whichever thread allocates, mid-way through that thread's AST conversion,
    and another thread can take over there."""

    def __init__(self) -> None:
        self.me = self

    def __del__(self) -> None:
        sum(range(100))


def _at_depth(depth: int, call):
    """`call()` `depth` frames down: threads start their conversions at other stack depths, as
    Dagster's threads do, which is what the interpreter-wide counter trips on."""
    return _at_depth(depth - 1, call) if depth else call()


def test_parses_digests_and_definition_loads_in_many_threads_at_once_never_trip_the_ast_builder(tmp_path, db_uri):
    """CPython 3.11's AST builder counts its recursion in one counter per interpreter; without the
    package's one parse lock around every parse it causes, this fails in every run (SystemError:
    AST constructor recursion depth mismatch). Run in a process of its own: the suite's process
    holds other tests' threads (Dagster's), whose parses are not the package's to lock."""
    make_docs(db_uri, 3)
    done = subprocess.run([sys.executable, "-c", f"from tests.integration.test_version_processes import stress; "
                           f"stress({str(tmp_path)!r}, {db_uri!r})"], cwd=REPO, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert done.stdout.strip().endswith("no error in 3 rounds"), done.stdout[-2000:]


def stress(tmp: str, db_uri: str) -> None:
    """Threads at other stack depths parse, digest and load definitions at once while another makes
    garbage with finalizers; prints "no error in 3 rounds", or raises the first error."""
    root = Path(tmp) / "big"
    (root / "bigpkg").mkdir(parents=True)
    (root / "bigpkg" / "__init__.py").write_text("")
    (root / "bigpkg" / "udfs.py").write_text(BIG_UDFS)
    sys.path.insert(0, str(root))
    import bigpkg.udfs as udfs  # noqa: PLC0415 -- the project made above

    errors: list[BaseException] = []
    stop = threading.Event()

    def guarded(work, depth: int):
        def run() -> None:
            try:
                for _ in range(2):
                    _at_depth(depth, work)
            except BaseException as err:  # noqa: BLE001 -- any error fails the test, with its kind
                errors.append(err)
        return threading.Thread(target=run)

    def garbage() -> None:
        while not stop.is_set():
            for _ in range(50):
                _Finalized()
            time.sleep(0)

    work = [
        (lambda: make_function(udfs.Embed, table="docs", column="embed"), 0),  # a digest parses the class's file
        (lambda: make_function(udfs.Embed, table="docs", column="embed"), 9),
        (lambda: build_definitions(assets=[gpu_function(table="docs", column="shout")(udfs.shout)], db_uri=db_uri), 4),
        (lambda: code_version.parse(BIG_UDFS), 5),
        (lambda: code_version.getsource(udfs.Embed), 13),
        (lambda: code_version.getsourcelines(udfs.Embed), 21),
        (lambda: code_version.signature(dict.get), 17),  # a builtin's text signature is parsed
    ]
    for _ in range(3):
        collector = threading.Thread(target=garbage)
        threads = [guarded(call, depth) for call, depth in work]
        collector.start()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        stop.set()
        collector.join()
        stop.clear()
        if errors:
            raise errors[0]
    print("no error in 3 rounds")
