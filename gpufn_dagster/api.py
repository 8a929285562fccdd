"""The read-only HTTP API: `GET /v1/gpu/classes`, the REST twin of `list_gpu_classes()`.

Classes are re-read on every request so an operator's edit shows without a restart; an invalid
directory answers 500 with the loader's message (file, class, field) rather than stale data.
"""

from __future__ import annotations

import hmac
import os

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .classes import GpuClassError, list_gpu_classes

TOKEN_ENV = "GPUFN_API_TOKEN"


def create_app(classes_dir: str | None = None, token: str | None = None) -> Starlette:
    """The API app; when a token is configured every request needs `Authorization: Bearer <token>`."""
    token = token if token is not None else os.environ.get(TOKEN_ENV) or None

    def authorized(request: Request) -> bool:
        if token is None:
            return True
        header = request.headers.get("authorization", "")
        scheme, _, value = header.partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), token.encode())

    async def gpu_classes(request: Request) -> JSONResponse:
        if not authorized(request):
            return JSONResponse({"error": "missing or wrong bearer token"}, status_code=401,
                                headers={"WWW-Authenticate": "Bearer"})
        try:
            classes = list_gpu_classes(classes_dir)
        except GpuClassError as err:
            return JSONResponse({"error": str(err)}, status_code=500)
        return JSONResponse({"classes": [c.summary() for c in classes]})

    return Starlette(routes=[Route("/v1/gpu/classes", gpu_classes, methods=["GET"])])
