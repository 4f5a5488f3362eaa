"""The FastAPI app factory every service uses: /healthz, /v1 routers, stable operation ids, one error format."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from shared import __version__
from shared.errors import ErrorBody, TasmoeError, format_loc, humanize
from shared.logging import RUN_ID_HEADER, bind_run_id
from shared.settings import Settings

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": desc}
    for code, desc in ((400, "Bad request"), (404, "Not found"), (409, "Conflict"), (422, "Invalid input"))
}


def operation_id(route: APIRoute) -> str:
    """Stable OpenAPI operation ids: ``<tag>-<function name>`` (exported specs do not churn)."""
    tag = str(route.tags[0]) if route.tags else "default"
    return f"{tag}-{route.name}"


def error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message, "field": field}})


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(TasmoeError)
    async def _tasmoe(_: Request, exc: TasmoeError) -> JSONResponse:
        return JSONResponse(status_code=exc.status, content=exc.body())

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        loc = list(first.get("loc", ()))
        if loc and loc[0] in {"body", "query", "path", "header"}:
            loc = loc[1:]
        field = format_loc(loc) or None
        message = humanize(first)
        return JSONResponse(
            status_code=422,
            content={"error": {"code": "invalid", "message": f"{field}: {message}" if field else message,
                               "field": field}},
        )

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 409: "conflict"}.get(exc.status_code, "http_error")
        return error_response(exc.status_code, code, str(exc.detail))

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        # Plain ValueErrors raised by domain functions on bad input are user errors, never 500s.
        return error_response(422, "invalid", str(exc))


def create_service_app(
    name: str,
    settings: Settings,
    routers: Sequence[APIRouter] = (),
    *,
    lifespan: Lifespan | None = None,
    description: str = "",
) -> FastAPI:
    """Build one service's app: routers mounted under ``/v1``, ``GET /healthz``, shared error handling."""
    app = FastAPI(
        title=f"tasmoe-{name}",
        version=__version__,
        description=description,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        responses=ERROR_RESPONSES,
    )
    app.state.settings = settings
    app.state.service_name = name
    install_error_handlers(app)

    @app.middleware("http")
    async def _run_id(request: Request, call_next: Callable[[Request], Any]) -> Any:
        with bind_run_id(request.headers.get(RUN_ID_HEADER)):
            return await call_next(request)

    @app.get("/healthz", tags=["health"], name="healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name, "version": __version__}

    for router in routers:
        app.include_router(router, prefix="/v1")
    return app


async def no_lifespan(_: FastAPI) -> AsyncIterator[None]:  # pragma: no cover - trivial
    yield
