"""The `gpufn-devcluster` command: the development control plane by hand, until Ctrl-C.

It lives in the checkout-only `gpufn-devcluster` distribution beside the test harness it shares
with the suite, so `pip install gpufn-dagster` ships neither.

Example::

    $ gpufn-devcluster --object-store
    control plane up in 6.1s with 6 nodes
    export KUBECONFIG=/tmp/gpufn-devcluster-.../kubeconfig
    ...
"""

from __future__ import annotations

import signal
from contextlib import ExitStack

import click

from gpufn_dagster.class_files import list_gpu_classes

from .cluster import DevCluster, binaries_dir
from .objectstore import ObjectStore


@click.command()
@click.option("--nodes-per-class", default=2, show_default=True)
@click.option("--cpu-nodes", default=2, show_default=True)
@click.option("--dir", "classes_dir", envvar="GPUFN_CLASSES_DIR", default=None, help="Class directory.")
@click.option("--object-store/--no-object-store", default=False, show_default=True,
              help="Also run an S3-compatible object store (SeaweedFS) for tables on object storage.")
def main(nodes_per_class: int, cpu_nodes: int, classes_dir: str | None, object_store: bool) -> None:
    """Run the development Kubernetes control plane with fake GPU pools until interrupted (from a checkout)."""
    with ExitStack() as stack:
        cluster = stack.enter_context(DevCluster(binaries_dir()))
        nodes = cluster.add_pools(list_gpu_classes(classes_dir), nodes_per_class=nodes_per_class, cpu=cpu_nodes)
        click.echo(f"control plane up in {cluster.started_seconds:.1f}s with {len(nodes)} nodes")
        click.echo(f"export KUBECONFIG={cluster.kubeconfig}")
        if object_store:
            store = stack.enter_context(ObjectStore(binaries_dir()))
            click.echo(f"object store (SeaweedFS) at {store.endpoint}; tables under {store.uri('lancedb')}:")
            for name, value in store.environment.items():
                click.echo(f"export {name}={value}")
            click.echo(f"export GPUFN_LANCEDB_URI={store.uri('lancedb')}")
        click.echo("Ctrl-C stops it and removes everything.")
        stop = {signal.SIGINT, signal.SIGTERM}
        signal.pthread_sigmask(signal.SIG_BLOCK, stop)  # sigwait only takes blocked signals
        signal.sigwait(stop)
