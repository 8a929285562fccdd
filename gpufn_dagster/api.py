"""The read-only HTTP API: `GET /v1/gpu/classes`, the REST twin of `list_gpu_classes()`, and
`GET /metrics`, each class's gauges in Prometheus' text format (`run.gauges`), under the same token.

Classes are re-read on every request so an operator's edit shows without a restart; an invalid
directory answers 500 with the loader's message (file, class, field) as JSON rather than stale
data. Loading runs in a worker thread, so one slow request never holds up another client.
"""

from __future__ import annotations

import hmac
import os
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from .class_files import cached_gpu_classes, list_gpu_classes
from .errors import ApiConfigError, GpuClassError
from .tags import class_choice

TOKEN_ENV = "GPUFN_API_TOKEN"


def class_metrics(instance: Any, classes_dir: str | None, now: float) -> str:
    """The `/metrics` text for the instance: embedded (its coordinator is GpuQueuedRunCoordinator),
    each class's local slots read from Dagster's pools now; on Kubernetes, the capacity sensor's
    last tick's gauges, with their age."""
    from .run.gauges import prometheus_text, stored_gauges
    from .embedded.coordinator import GpuQueuedRunCoordinator, embedded_class_gauges

    classes = cached_gpu_classes(classes_dir)
    if isinstance(instance.run_coordinator, GpuQueuedRunCoordinator):
        return prometheus_text(embedded_class_gauges(instance, classes, now))
    stored = stored_gauges(instance)
    if stored is None:
        return prometheus_text([])
    gauges, observed_at = stored
    return prometheus_text([g for g in gauges if all(name in classes for name in class_choice(g.gpu_class))],
                           age_seconds=now - observed_at)


def create_app(classes_dir: str | None = None, token: str | None = None, dagster_home: Path | None = None) -> Starlette:
    """The API app; when a token is configured every request needs `Authorization: Bearer <token>`.

    Args:
        classes_dir: the directory of class files (default `$GPUFN_CLASSES_DIR` or `./classes`).
        token: the bearer token every request must carry (default `$GPUFN_API_TOKEN`); None serves
            without one. An empty token is refused: it would let `Authorization: Bearer ` in.
        dagster_home: the Dagster instance whose runs `/metrics` reports on (its dagster.yaml's
            storage: SQLite or PostgreSQL); None answers `/metrics` with 503, saying so.
    """
    if token is None:
        token = os.environ.get(TOKEN_ENV)
    if token is not None and not token.strip():
        raise ApiConfigError("the API token is empty; set a non-empty token, or none to serve without one")

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and bool(value) and hmac.compare_digest(value.encode(), token.encode())

    async def gpu_classes(request: Request) -> JSONResponse:
        if not authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        try:
            classes = await run_in_threadpool(list_gpu_classes, classes_dir)
        except GpuClassError as err:
            return JSONResponse({"error": str(err)}, status_code=500)
        return JSONResponse({"classes": [c.summary() for c in classes]})

    opened: list[Any] = []  # the instance, opened on the first scrape and kept

    def metrics_text() -> str:
        if not opened:
            from dagster import DagsterInstance

            opened.append(DagsterInstance.from_config(str(dagster_home)))
        return class_metrics(opened[0], classes_dir, time.time())

    async def metrics(request: Request) -> Response:
        if not authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        if dagster_home is None:
            return PlainTextResponse("no Dagster instance: set DAGSTER_HOME where gpufn serve runs\n", status_code=503)
        try:
            text = await run_in_threadpool(metrics_text)
        except GpuClassError as err:
            return PlainTextResponse(f"{err}\n", status_code=500)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    return Starlette(routes=[Route("/v1/gpu/classes", gpu_classes, methods=["GET"]),
                             Route("/metrics", metrics, methods=["GET"])])
