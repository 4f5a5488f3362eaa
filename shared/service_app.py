"""The FastAPI app factory every service uses: /healthz, /v1 routers, stable operation ids, one error format."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.routing import APIRoute
from pydantic import BaseModel, ValidationError
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shared import __version__
from shared.auth import ANONYMOUS, LOCAL_ADMIN, PUBLIC_PATHS, PUBLIC_PREFIXES, KeyStore, Principal, bearer, needed_scope
from shared.blas import limit_blas_threads
from shared.body_guard import JsonBodyGuard, JsonLimits
from shared.errors import TasmoeError, first_validation_error, format_loc, humanize
from shared.json_codec import loads as parse_json
from shared.link_tokens import LinkTokens
from shared.logging import RUN_ID_HEADER, bind_run_id
from shared.settings import Settings

log = logging.getLogger(__name__)

Lifespan = Callable[[FastAPI], AbstractAsyncContextManager[None]]


class ErrorDetail(BaseModel):
    code: str
    message: str
    field: str | None = None


class ErrorBody(BaseModel):  # every 4xx/5xx answer; TasmoeError.body() builds this shape without pydantic
    error: ErrorDetail


class OrjsonRequest(Request):
    """A request whose JSON body is parsed by orjson (`shared.json_codec.loads`) instead of the standard library's
    ``json.loads``, which Starlette's ``Request.json`` calls and FastAPI's route handler awaits for every JSON body.

    Why: a control epoch's request body is megabytes of numbers (the physical state, the windows' deposits); at the
    default experiment's heavier loads the standard library's parse of it was the largest item of a run's CPU after
    the physicalizer itself (py-spy). The values are the same: a body orjson refuses (the ``NaN``/``Infinity``
    tokens, invalid JSON) or would read differently (an integer beyond 64 bits) is parsed by the standard library
    as before, so invalid JSON raises the same ``json.JSONDecodeError`` and gets the same 422."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = parse_json(await self.body())
        return self._json


class JsonRoute(APIRoute):
    """The route class of every service's router (``APIRouter(route_class=JsonRoute)``): its handler reads the
    request as an `OrjsonRequest` (FastAPI's documented way to give a route its own ``Request`` class)."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def orjson_route_handler(request: Request) -> Response:
            return await handler(OrjsonRequest(request.scope, request.receive))

        return orjson_route_handler


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": desc}
    for code, desc in ((401, "No valid API key (TASMOE_AUTH=keys)"),
                       (403, "The key's scope does not allow this"), (404, "Not found"), (409, "Conflict"),
                       (413, "Request body too large"), (422, "Invalid input"),
                       (429, "Over the principal's quota; see Retry-After"),
                       (500, "A bug (logged on the server with its traceback; never sent)"),
                       (502, "A service this one called failed or could not be reached"))
}


def operation_id(route: APIRoute) -> str:
    """Stable OpenAPI operation ids: ``<tag>-<function name>`` (exported specs do not churn)."""
    tag = str(route.tags[0]) if route.tags else "default"
    return f"{tag}-{route.name}"


def error_response(status: int, code: str, message: str, field: str | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"code": code, "message": message, "field": field}})


def _validation_field(err: Mapping[str, Any]) -> tuple[str | None, str]:
    """(field path, message) for one FastAPI request-validation error; the ``body``/``query``/... prefix is dropped."""
    loc = list(err.get("loc", ()))
    where = str(loc[0]) if loc and loc[0] in _LOC_SOURCES else None
    if where is not None:
        loc = loc[1:]
    if err.get("type") == "json_invalid":  # loc is (body, char position): not a field
        ctx = err.get("ctx") or {}
        return None, f"request body is not valid JSON: {ctx.get('error', err.get('msg', 'decode error'))}"
    field = format_loc(loc) or None
    message = humanize(err)
    if field is None and where == "body" and err.get("type") == "missing":
        message = "request body is required"
    return field, message


_LOC_SOURCES = {"body", "query", "path", "header", "cookie"}


def install_error_handlers(app: FastAPI) -> None:
    """Every error leaves as ``{"error": {"code", "message", "field"}}``: TasmoeError (its status), request validation
    (422 with the field path), 404/405/... from routing, ValueError from domain code (422) and anything else (500)."""

    @app.exception_handler(TasmoeError)
    async def _tasmoe(_: Request, exc: TasmoeError) -> JSONResponse:
        resp = JSONResponse(status_code=exc.status, content=exc.body())
        retry_after = getattr(exc, "retry_after_s", None)
        if retry_after is not None:
            resp.headers["Retry-After"] = str(int(retry_after))
        return resp

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        first: Mapping[str, Any] = errors[0] if errors else {"loc": (), "msg": "invalid request"}
        field, message = _validation_field(first)
        return error_response(422, "invalid", f"{field}: {message}" if field else message, field)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = {404: "not_found", 405: "method_not_allowed", 409: "conflict"}.get(exc.status_code, "http_error")
        resp = error_response(exc.status_code, code, str(exc.detail))
        for key, value in (exc.headers or {}).items():  # keep e.g. the Allow header of a 405
            resp.headers[key] = value
        return resp

    @app.exception_handler(ValidationError)
    async def _pydantic(_: Request, exc: ValidationError) -> JSONResponse:
        # A pydantic model validated inside a handler (a nested config, a contract): name the field, one line.
        field, message = first_validation_error(exc)
        return error_response(422, "invalid", f"{field}: {message}" if field else message, field or None)

    @app.exception_handler(ValueError)
    async def _value(_: Request, exc: ValueError) -> JSONResponse:
        # Plain ValueErrors raised by domain functions on bad input are user errors, never 500s.
        return error_response(422, "invalid", str(exc))

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> JSONResponse:
        # A bug, not a user error: log the traceback, answer with the same body shape (no stack trace on the wire).
        with bind_run_id(request.headers.get(RUN_ID_HEADER)):  # this handler runs outside RunIdMiddleware
            log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
        return error_response(500, "internal", f"internal error ({type(exc).__name__})")


def install_database_errors(app: FastAPI) -> None:
    """A service with a database of its own (the orchestrator) answers a request that met the database away with
    503 ``database_unavailable`` and ``Retry-After`` (`shared.db.database_outage`: a lost or refused connection, a
    server restarting, a pool exhausted) instead of a 500: the client retries, nothing is wrong with its request.
    Any other database error is the bug it is (500, logged with its traceback). Both are answered here, inside the
    app, so the connection stays open for the client's next request."""
    from sqlalchemy.exc import DBAPIError
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from shared.db import database_outage, outage_text
    from shared.errors import DatabaseUnavailable

    async def _database(request: Request, exc: Exception) -> JSONResponse:
        with bind_run_id(request.headers.get(RUN_ID_HEADER)):
            if not database_outage(exc):
                log.error("unhandled database error on %s %s", request.method, request.url.path, exc_info=exc)
                return error_response(500, "internal", f"internal error ({type(exc).__name__})")
            log.warning("%s %s: the database is unreachable (%s)", request.method, request.url.path,
                        outage_text(exc))
        err = DatabaseUnavailable("the run-state database cannot be reached for now; retry after Retry-After "
                                  "seconds (a POST sent with an Idempotency-Key is safe to repeat)")
        resp = JSONResponse(status_code=err.status, content=err.body())
        resp.headers["Retry-After"] = str(err.retry_after_s)
        return resp

    app.add_exception_handler(DBAPIError, _database)
    app.add_exception_handler(PoolTimeout, _database)


class RunIdMiddleware:
    """Bind the request's ``X-Run-Id`` header (the caller's run) for the request's lifetime, so every log record the
    service writes while answering it carries that run id. Pure ASGI (no BaseHTTPMiddleware), so the context variable
    is visible to sync endpoints in the thread pool and to background tasks alike."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        run_id = Headers(scope=scope).get(RUN_ID_HEADER)
        with bind_run_id(run_id):
            await self.app(scope, receive, send)


class AuthMiddleware:
    """Who is calling (``shared.auth``): with a key store, every request but the public paths needs a bearer key of
    a sufficient scope (401 / 403 with the standard error body); without one (TASMOE_AUTH=off) every caller is the
    local admin. The principal is in ``request.state.principal`` for the routes.

    ``link_tokens``: a request without a bearer key may carry a link token (``?token=``, `shared.link_tokens`) on
    the GET paths of the one experiment it was issued for; it then runs as the token's principal."""

    def __init__(self, app: ASGIApp, store: KeyStore | None, link_tokens: LinkTokens | None = None) -> None:
        self.app = app
        self.store = store
        self.link_tokens = link_tokens

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if self.store is None:
            state["principal"] = LOCAL_ADMIN
            await self.app(scope, receive, send)
            return
        # the path inside this app (under `tasmoe serve all` the app is mounted below a prefix, its root_path)
        path, root = scope["path"], scope.get("root_path", "")
        rel = path[len(root):] if root and path.startswith(root) else path
        if rel in PUBLIC_PATHS or rel.startswith(PUBLIC_PREFIXES):  # an experiment called "docs" is not public
            state["principal"] = ANONYMOUS
            await self.app(scope, receive, send)
            return
        token = bearer(Headers(scope=scope).get("authorization"))
        principal = self.store.verify(token) if token else None
        link = None if token is not None or self.link_tokens is None else _query_token(scope)
        if link is not None and self.link_tokens is not None:
            grant = self.link_tokens.verify(link, rel, scope["method"])
            if grant is None:
                await error_response(401, "unauthorized", "the link token is invalid, expired or not for this "
                                     "path: ask GET /v1/experiments/{id}/token for a new one",
                                     field="token")(scope, receive, send)
                return
            principal = grant.principal
            state["link_expires_at"] = grant.expires_at  # a stream opened with it ends then
        if principal is None:
            msg = ("no API key: send 'Authorization: Bearer <key>' (tasmoe keys create)" if token is None
                   else "the API key is unknown or revoked")
            resp = error_response(401, "unauthorized", msg, field="Authorization")
            resp.headers["WWW-Authenticate"] = 'Bearer realm="tasmoe"'
            await resp(scope, receive, send)
            return
        needed = needed_scope(scope["method"])
        if not principal.allows(needed):
            await error_response(403, "forbidden", f"the key's scope {principal.scope!r} does not allow "
                                 f"{scope['method']} (needs {needed!r})", field="Authorization")(scope, receive, send)
            return
        state["principal"] = principal
        await self.app(scope, receive, send)


def _query_token(scope: Scope) -> str | None:
    """The ``token`` query parameter of a request (the last one when repeated), or None."""
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"").decode("latin-1")
    found = [v for k, v in parse_qsl(raw, keep_blank_values=True) if k == "token"]
    return found[-1] if found else None


def principal_of(request: Request) -> Principal:
    """The caller (``AuthMiddleware``); the local admin only where no middleware ran (a bare router in a test)."""
    p = getattr(request.state, "principal", None)
    if p is None and "principal" not in request.scope.get("state", {}):
        return LOCAL_ADMIN
    return p if isinstance(p, Principal) else ANONYMOUS


DOCS_STATIC = "/docs-static"


def _local_docs(app: FastAPI) -> None:
    """``/docs`` (Swagger UI) and ``/redoc`` from assets served by the service itself (the package fastapi-offline
    ships Swagger UI, Apache-2.0, and ReDoc, MIT; its own licence MIT), so the pages work on a lab network without
    the internet. Under ``tasmoe serve all`` every URL carries the mount's prefix (the request's root_path)."""
    from importlib.resources import files

    from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
    from fastapi.staticfiles import StaticFiles

    static = files("fastapi_offline") / "static"
    app.mount(DOCS_STATIC, StaticFiles(directory=str(static)), name="docs-static")

    def prefix(request: Request) -> str:
        return str(request.scope.get("root_path", "")).rstrip("/")

    @app.get("/docs", include_in_schema=False)
    async def swagger(request: Request) -> Response:
        p = prefix(request)
        return get_swagger_ui_html(openapi_url=f"{p}/openapi.json", title=f"{app.title} - Swagger UI",
                                   oauth2_redirect_url=f"{p}/docs/oauth2-redirect",
                                   swagger_js_url=f"{p}{DOCS_STATIC}/swagger-ui-bundle.js",
                                   swagger_css_url=f"{p}{DOCS_STATIC}/swagger-ui.css",
                                   swagger_favicon_url=f"{p}{DOCS_STATIC}/favicon.png")

    @app.get("/docs/oauth2-redirect", include_in_schema=False)
    async def oauth2_redirect() -> Response:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc(request: Request) -> Response:
        p = prefix(request)
        return get_redoc_html(openapi_url=f"{p}/openapi.json", title=f"{app.title} - ReDoc",
                              redoc_js_url=f"{p}{DOCS_STATIC}/redoc.standalone.js",
                              redoc_favicon_url=f"{p}{DOCS_STATIC}/favicon.png", with_google_fonts=False)


def _add_security_scheme(app: FastAPI) -> None:
    """Document the bearer key in the OpenAPI (every operation but /healthz), whatever TASMOE_AUTH is."""
    base = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            spec = base()
            spec.setdefault("components", {}).setdefault("securitySchemes", {})["apiKey"] = {
                "type": "http", "scheme": "bearer",
                "description": "an API key (tasmoe keys create); required when the server runs with TASMOE_AUTH=keys"}
            for path, item in spec.get("paths", {}).items():
                if path.endswith("/healthz"):
                    continue
                for op in item.values():
                    if isinstance(op, dict):
                        op["security"] = [{"apiKey": []}, {}]
            app.openapi_schema = spec
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


class BodyLimitMiddleware:
    """Refuse a request body over ``max_bytes`` with 413 and the standard error body: by its Content-Length before
    reading anything, and a body sent without one (chunked) by reading it here up to the limit before the app sees
    it, so a client cannot make the service hold an arbitrarily large body in memory (``TASMOE_MAX_BODY_MB``) and
    the answer is the 413 whatever the route does with a body it could not read."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    def _too_large(self, size: int | None) -> JSONResponse:
        got = f"{size} bytes" if size is not None else "a chunked body longer than that"
        return error_response(413, "too_large", f"request body is over the limit of {self.max_bytes} bytes ({got}); "
                              "set TASMOE_MAX_BODY_MB to change the limit", field="body")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = Headers(scope=scope).get("content-length")
        if length is not None and length.strip().isdigit():
            if int(length) > self.max_bytes:
                await self._too_large(int(length))(scope, receive, send)
                return
            await self.app(scope, receive, send)  # the server delivers no more than the length it announced
            return
        messages: list[Message] = []  # no length: read it whole (up to the limit), then replay it to the app
        seen = 0
        while True:
            message = await receive()
            messages.append(message)
            if message["type"] != "http.request":
                break
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
                await self._too_large(None)(scope, receive, send)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)


def create_service_app(
    name: str,
    settings: Settings,
    routers: Sequence[APIRouter] = (),
    *,
    lifespan: Lifespan | None = None,
    description: str = "",
    link_tokens: LinkTokens | None = None,
) -> FastAPI:
    """Build one service's app: routers mounted under ``/v1``, ``GET /healthz``, shared error handling. Caps the
    process's BLAS threads at ``settings.blas_threads`` (``shared.blas``). ``link_tokens``: the service issues link
    tokens (the orchestrator, for its dashboard) and accepts them in place of a key where they apply
    (``app.state.link_tokens``)."""
    limit_blas_threads(settings.blas_threads)
    app = FastAPI(
        title=f"tasmoe-{name}",
        version=__version__,
        description=description,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        responses=ERROR_RESPONSES,
        docs_url=None,
        redoc_url=None,
    )
    _local_docs(app)
    app.state.settings = settings
    app.state.service_name = name
    app.state.link_tokens = link_tokens
    install_error_handlers(app)

    # innermost: after the key check, inside the body size limit (shared.body_guard)
    app.add_middleware(JsonBodyGuard, limits=JsonLimits.of(settings))
    store = KeyStore(settings.effective_keys_file()) if settings.auth == "keys" else None
    if link_tokens is not None:
        link_tokens.store = store
    app.add_middleware(AuthMiddleware, store=store, link_tokens=link_tokens if store is not None else None)
    app.add_middleware(RunIdMiddleware)
    app.add_middleware(BodyLimitMiddleware, max_bytes=int(settings.max_body_mb * 2**20))
    _add_security_scheme(app)

    @app.get("/healthz", tags=["health"], name="healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok", "service": name, "version": __version__}

    for router in routers:
        app.include_router(router, prefix="/v1")
    return app


async def no_lifespan(_: FastAPI) -> AsyncIterator[None]:  # pragma: no cover - trivial
    yield
