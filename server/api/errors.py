"""The one place that maps the service's errors to HTTP status codes and bodies.

422 bodies name every refused field: `{"detail": [{"field": "hyperparameters[2].min", "reason":
"..."}], "message": "..."}`; other errors answer `{"detail": "message"}`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.routing import Match

from hpo.server.errors import (
    AlreadyExists,
    Conflict,
    FieldError,
    Forbidden,
    HpoError,
    InvalidInput,
    NotFound,
    QuotaExceeded,
    StorageError,
    one_line,
)

_log = logging.getLogger("hpo.server")

_STATUS: dict[type[HpoError], int] = {
    InvalidInput: 422,
    Forbidden: 403,
    NotFound: 404,
    AlreadyExists: 409,
    Conflict: 409,
    QuotaExceeded: 413,
    StorageError: 503,
}


def status_of(error: HpoError) -> int:
    for cls in type(error).__mro__:
        if cls in _STATUS:
            return _STATUS[cls]  # type: ignore[index]
    return 400


def field_path(loc: Sequence[Any]) -> str:
    """("body", "hyperparameters", 2, "min") -> "hyperparameters[2].min"."""
    parts = list(loc[1:] if loc and loc[0] in ("body", "query", "path") else loc)
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or (str(loc[0]) if loc else "body")


def _validation_errors(exc: RequestValidationError, request: Request | None = None) -> list[FieldError]:
    errors = []
    for error in exc.errors():
        if error.get("type") == "json_invalid":
            reason = f"malformed JSON: {error.get('ctx', {}).get('error', 'cannot be parsed')}"
            errors.append(FieldError("body", reason))
        elif error.get("type") == "extra_forbidden" and request is not None:
            # `{"action": "pause"}` on PATCH: say which fields the body takes.
            known = _body_fields(request)
            reason = f"is not a known field (known: {', '.join(known)})" if known else "is not a known field"
            errors.append(FieldError(field_path(error.get("loc", ())), reason))
        else:
            errors.append(FieldError(field_path(error.get("loc", ())), str(error.get("msg", "invalid"))))
    return errors


def _body_fields(request: Request) -> list[str]:
    """The top-level fields of the route's request body model (empty when unknown)."""
    field = getattr(request.scope.get("route"), "body_field", None)
    model = getattr(field, "type_", None) or getattr(getattr(field, "field_info", None), "annotation", None)
    return list(getattr(model, "model_fields", {}) or {})


def invalid_response(errors: list[FieldError]) -> JSONResponse:
    body = {"detail": [e.as_dict() for e in errors], "message": "; ".join(f"{e.field}: {e.reason}" for e in errors)}
    return JSONResponse(status_code=422, content=body)


def _allowed(request: Request) -> str:
    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches({**request.scope, "method": "_"})
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    return ", ".join(sorted(methods))


def error_response(exc: HpoError) -> JSONResponse:
    """The answer to one of the service's errors (also for `hotpath`, which is not a route)."""
    if isinstance(exc, InvalidInput):
        return invalid_response(exc.errors)
    if isinstance(exc, StorageError):
        _log.warning("storage error: %s", one_line(exc))
    return JSONResponse(status_code=status_of(exc), content={"detail": exc.message})


def install(app: FastAPI) -> None:
    @app.exception_handler(HpoError)
    async def _hpo_error(_request: Request, exc: HpoError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        return invalid_response(_validation_errors(exc, request))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        if exc.status_code == 405:
            # Starlette names the methods of the first route on the path only; a path served
            # by several routes (GET and POST /studies) must list them all.
            return JSONResponse(status_code=405, content={"detail": exc.detail}, headers={"Allow": _allowed(request)})
        if exc.status_code == 400 and exc.detail == "There was an error parsing the body":
            # FastAPI's answer when json.loads itself fails other than by syntax: nesting deeper
            # than the parser recurses (RecursionError), or bytes that are not text.
            return invalid_response([FieldError("body", "cannot be parsed: nested too deeply, or not UTF-8 text")])
        return JSONResponse(status_code=exc.status_code, content={"detail": exc.detail}, headers=exc.headers)

    @app.exception_handler(RecursionError)
    async def _too_deep(_request: Request, exc: RecursionError) -> JSONResponse:
        # json.loads and pydantic recurse per nesting level; a body nested thousands deep is
        # the client's error, refused before anything is stored.
        return invalid_response([FieldError("body", "is nested too deeply")])

    @app.exception_handler(ClientDisconnect)
    async def _gone(_request: Request, _exc: ClientDisconnect) -> Response:
        # The client went away mid-body: `hostile.py` logged it in one line; no one reads this.
        return Response(status_code=400)

    @app.exception_handler(Exception)
    async def _unexpected(_request: Request, exc: Exception) -> JSONResponse:
        _log.exception("unexpected error", exc_info=exc)
        return JSONResponse(status_code=500, content={"detail": "internal error; see the server log"})
