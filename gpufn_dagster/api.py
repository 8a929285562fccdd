"""The read-only HTTP API: `GET /v1/gpu/classes`, the REST twin of `list_gpu_classes()`.

Classes are re-read on every request so an operator's edit shows without a restart; an invalid
directory answers 500 with the loader's message (file, class, field) as JSON rather than stale
data. Loading runs in a worker thread, so one slow request never holds up another client.
"""

from __future__ import annotations

import hmac
import os

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .classes import list_gpu_classes
from .errors import ApiConfigError, GpuClassError

TOKEN_ENV = "GPUFN_API_TOKEN"


def create_app(classes_dir: str | None = None, token: str | None = None) -> Starlette:
    """The API app; when a token is configured every request needs `Authorization: Bearer <token>`.

    Args:
        classes_dir: the directory of class files (default `$GPUFN_CLASSES_DIR` or `./classes`).
        token: the bearer token every request must carry (default `$GPUFN_API_TOKEN`); None serves
            without one. An empty token is refused: it would let `Authorization: Bearer ` in.
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

    return Starlette(routes=[Route("/v1/gpu/classes", gpu_classes, methods=["GET"])])
