"""The `gpufn` command: list GPU classes, serve the HTTP API, show the capacity queue,
write Kueue manifests, write a code location's schemas state, append example data.

The development control plane has its own command, `gpufn-devcluster`, in the checkout-only
`gpufn-devcluster` distribution (`devcluster/`), so the runtime wheel ships none of it.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from .class_files import list_gpu_classes
from .errors import GpuClassError


def _gib(value: int) -> str:
    return f"{value / 2**30:g}GiB"


@click.group()
def main() -> None:
    """GPU Functions on LanceDB tables, from Dagster."""


@main.command()
@click.option("--dir", "classes_dir", envvar="GPUFN_CLASSES_DIR", default=None, help="Class directory (default ./classes).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def classes(classes_dir: str | None, as_json: bool) -> None:
    """List the configured GPU classes."""
    try:
        found = list_gpu_classes(classes_dir)
    except GpuClassError as err:
        click.echo(str(err), err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps([c.summary() for c in found], indent=2))
        return
    from tabulate import tabulate

    rows = [[c.name, c.gpu_model, _gib(c.gpu_memory_bytes), c.requested_as, c.max_gpu_count_per_worker,
             c.local.slots, "" if c.price_per_gpu_hour is None else f"${c.price_per_gpu_hour:.2f}"] for c in found]
    click.echo(tabulate(rows, headers=["NAME", "GPU MODEL", "GPU MEMORY", "RESOURCE", "MAX GPUS/WORKER",
                                       "LOCAL SLOTS", "PRICE/GPU-H"]))


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8765, show_default=True, type=int)
@click.option("--dir", "classes_dir", envvar="GPUFN_CLASSES_DIR", default=None, help="Class directory.")
@click.option("--token", envvar="GPUFN_API_TOKEN", default=None, help="Require this bearer token (or $GPUFN_API_TOKEN).")
@click.option("--allow-unauthenticated", is_flag=True,
              help="Serve a non-loopback address without a token (anyone who reaches it can read the classes).")
def serve(host: str, port: int, classes_dir: str | None, token: str | None, allow_unauthenticated: bool) -> None:
    """Serve GET /v1/gpu/classes and GET /metrics (per-class gauges of the instance in $DAGSTER_HOME)."""
    import ipaddress

    import uvicorn

    from .api import create_app
    from .errors import ApiConfigError

    try:
        app = create_app(classes_dir, token, dagster_home=_dagster_home())
    except ApiConfigError as err:
        raise click.BadParameter(str(err), param_hint="--token / $GPUFN_API_TOKEN") from None
    if not token:
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = host == "localhost"
        if not loopback and not allow_unauthenticated:
            raise click.BadParameter(f"{host} is not a loopback address and no token is set: pass --token (or "
                                     "$GPUFN_API_TOKEN), or --allow-unauthenticated to serve it open",
                                     param_hint="--host")
        click.echo(f"gpufn serve: no token set: anyone who can reach {host}:{port} can list the GPU classes "
                   "(GET /v1/gpu/classes) and read every class's gauges (GET /metrics)", err=True)
    uvicorn.run(app, host=host, port=port, log_level="info")


# Where the README's `dagster dev` keeps its instance (run history, sensor cursors) in a checkout.
PROJECT_HOME = ".dagster_home"


def _dagster_home() -> Path | None:
    """$DAGSTER_HOME, else the project's own home beside this directory's dagster.yaml, else None."""
    if os.environ.get("DAGSTER_HOME"):
        return Path(os.environ["DAGSTER_HOME"])
    home = Path(PROJECT_HOME)
    return home.resolve() if (home / "dagster.yaml").is_file() else None


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
def capacity(as_json: bool) -> None:
    """Runs waiting for GPU capacity, per class (the instance in $DAGSTER_HOME, else ./.dagster_home)."""
    home = _dagster_home()
    if home is None:
        raise click.ClickException(f"no Dagster instance here: set DAGSTER_HOME, or run this where the README's "
                                   f"`dagster dev` runs (it keeps its instance in ./{PROJECT_HOME})")
    from dagster import DagsterInstance

    from .run.run_plan import waiting_runs

    with DagsterInstance.from_config(str(home)) as instance:
        waiting = waiting_runs(instance)
    if as_json:
        click.echo(json.dumps({name: [{"run_id": r, "waited_seconds": round(w, 1), "wait_estimate": e}
                                      for r, w, e in items] for name, items in waiting.items()}, indent=2))
        return
    if not waiting:
        click.echo("no run is waiting for GPU capacity")
        return
    from tabulate import tabulate

    rows = [[name, len(items), f"{items[0][1]:.0f}s", items[-1][2] or "-", ", ".join(r[:8] for r, _, _ in items)]
            for name, items in waiting.items()]
    click.echo(tabulate(rows, headers=["GPU CLASS", "WAITING RUNS", "LONGEST WAIT", "LAST IN LINE STARTS", "RUNS"]))


def _pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    bad = [v for v in values if "=" not in v]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not NAME=VALUE", param_hint=option)
    return dict(v.split("=", 1) for v in values)


@main.command("kueue-manifests")
@click.option("--dir", "classes_dir", envvar="GPUFN_CLASSES_DIR", default=None, help="Class directory (default ./classes).")
@click.option("--namespace", required=True, help="Where the run and step Jobs are (the LocalQueues go there).")
@click.option("--gpus", multiple=True, metavar="CLASS=N",
              help="GPU quota of a class's ClusterQueue; repeatable (default: one worker's most GPUs).")
@click.option("--local-queue", "local_queues", multiple=True, metavar="CLASS=NAME",
              help="Put a class whose file has no kueue block in Kueue mode for this output (to prepare Kueue "
                   "before adding the block to its file); repeatable.")
@click.option("--priority-classes", default="", metavar="P=NAME,...",
              help="With --local-queue: the dagster/priority thresholds and WorkloadPriorityClasses, e.g. "
                   "10=gpufn-high,0=gpufn-normal,-10=gpufn-low.")
@click.option("--choice", "choices", multiple=True, metavar="CLASS,CLASS,...",
              help="Classes a Function accepts in this order (gpu_class=[...]): a ClusterQueue with their flavors "
                   "in that order, borrowing their quota, and its LocalQueue; repeatable.")
def kueue_manifests(classes_dir: str | None, namespace: str, gpus: tuple[str, ...], local_queues: tuple[str, ...],
                    priority_classes: str, choices: tuple[str, ...]) -> None:
    """Print the Kueue objects (ResourceFlavor, ClusterQueue, LocalQueue, WorkloadPriorityClass) that
    match the GPU classes in Kueue mode, as YAML for `kubectl apply -f -`."""
    import yaml

    from pydantic import ValidationError

    from .class_files import load_gpu_classes
    from .class_requests import accept
    from .classes import GpuClass, KueueQueue
    from .errors import ClassRequestError
    from .run.kueue import kueue_manifests as manifests

    try:
        classes = load_gpu_classes(classes_dir)
    except GpuClassError as err:
        raise click.ClickException(str(err)) from None
    priorities = _pairs(tuple(p for p in priority_classes.split(",") if p), "--priority-classes")
    try:
        quota = {name: int(count) for name, count in _pairs(gpus, "--gpus").items()}
        by_threshold = {int(threshold): name for threshold, name in priorities.items()}
    except ValueError as err:
        raise click.BadParameter(f"not a whole number: {err}") from None
    for name, queue in _pairs(local_queues, "--local-queue").items():
        if name not in classes:
            raise click.BadParameter(f"no class {name!r}; classes: {', '.join(sorted(classes))}", param_hint="--local-queue")
        if classes[name].kueue is None:
            try:  # validated as in a class file: a DRA class's quota needs its device_resource, from its file
                classes[name] = GpuClass.model_validate({**classes[name].model_dump(), "kueue": KueueQueue(
                    local_queue=queue, priority_classes=by_threshold).model_dump()})
            except ValidationError as err:
                raise click.BadParameter(f"class {name!r}: {err.errors()[0]['msg']} (write the kueue block, with "
                                         "device_resource, in its class file)", param_hint="--local-queue") from None
    unknown = sorted(set(quota) - set(classes))
    if unknown:
        raise click.BadParameter(f"no class {unknown[0]!r}; classes: {', '.join(sorted(classes))}", param_hint="--gpus")
    accepted = [tuple(name.strip() for name in choice.split(",")) for choice in choices]
    for names in accepted:
        if not_queued := [n for n in names if n not in classes or classes[n].kueue is None]:
            raise click.BadParameter(f"{not_queued[0]!r} is not a class in Kueue mode", param_hint="--choice")
        try:  # the one rule of what a Function may accept: a choice it refuses gets no queue
            accept(names, None, classes)
        except ClassRequestError as err:
            raise click.BadParameter(err.problem, param_hint="--choice") from None
    objects = manifests(sorted(classes.values(), key=lambda c: c.name), quota, namespace, accepted)
    if not objects:
        raise click.ClickException("no class is in Kueue mode: add a `kueue: {local_queue: ...}` block to a class "
                                   "file, or name one with --local-queue")
    click.echo(yaml.safe_dump_all(objects, sort_keys=False), nl=False)


@main.command("refresh-state")
@click.option("-f", "--python-file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The file defining the code location (as `dagster dev -f` takes it).")
@click.option("-m", "--module-name", help="The module defining it (as `dagster dev -m` takes it).")
def refresh_state(python_file: Path | None, module_name: str | None) -> None:
    """Write the tables' schemas of each `build_definitions(schemas_state=...)` a code location runs,
    so its code server then loads it without opening a table.

    Run it where the tables are reachable, as `dg utils refresh-defs-state` is run for a state-backed
    component: a deploy step, an image build, or by hand after a table's columns change.

    \b
    Example:
        gpufn refresh-state -f definitions.py
    """
    import importlib
    import runpy

    from .assets.table_schemas import refreshing

    if (python_file is None) == (module_name is None):
        raise click.UsageError("name the code location with one of -f FILE or -m MODULE")
    target = str(python_file) if python_file is not None else module_name
    sys.path.insert(0, str(python_file.resolve().parent) if python_file is not None else os.getcwd())
    with refreshing() as written:
        if python_file is not None:
            runpy.run_path(str(python_file), run_name=python_file.stem)
        else:
            importlib.import_module(module_name)
    if not written:
        raise click.ClickException(f"{target}: no build_definitions(schemas_state=...) ran, so there is no state "
                                   "file to write: pass schemas_state to build_definitions")
    for path, db_uri, tables in written:
        click.echo(f"wrote {path.resolve()}: the schemas of {len(tables)} table(s) of {db_uri} ({', '.join(tables)})")


@main.command("append-docs")
@click.option("--rows", default=100, show_default=True, help="How many sample documents to append.")
@click.option("--db", envvar="GPUFN_LANCEDB_URI", default=".gpufn_data/lancedb", show_default=True,
              help="The database: a local path or s3://bucket/folder.")
@click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
              help="An object-store setting as Lance takes it (aws_endpoint=..., allow_http=true); repeatable. "
                   "Credentials are best left to the AWS_* environment variables.")
def append_docs(rows: int, db: str, storage_options: tuple[str, ...]) -> None:
    """Append sample documents to the example's `docs` table (the sensor then starts a refresh).

    It writes through Lance itself, as a pipeline landing new data would: importing lancedb (for its
    remote client's generated models) takes seconds, longer than a small append.
    """
    import lance
    import pyarrow.compute as pc

    from .sample import sample_docs

    options = dict(option.split("=", 1) for option in storage_options if "=" in option)
    bad = [option for option in storage_options if "=" not in option]
    if bad:
        raise click.BadParameter(f"{bad[0]!r} is not KEY=VALUE", param_hint="--storage-option")
    uri = f"{db.rstrip('/')}/docs.lance"
    try:
        dataset = lance.dataset(uri, storage_options=options or None)
    except ValueError as err:  # Lance's "Dataset at path ... was not found"
        raise click.ClickException(f"no table docs in {db}: materialize the example's `docs` asset first") from err
    ids = dataset.to_table(columns=["id"]).column("id")
    dataset = lance.write_dataset(sample_docs(rows, start_id=(pc.max(ids).as_py() or -1) + 1), dataset, mode="append")
    click.echo(f"appended {rows} documents to {db}/docs (now {dataset.count_rows():,} rows, version {dataset.version})")


if __name__ == "__main__":
    main()
