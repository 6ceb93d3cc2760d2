"""Every failure as the one JSON error body, with the status the wire protocol gives it.

    {"error": {"type": "NotFoundError", "exit_code": 3, "message": "...", "hint": null, "scope": null}}

A ``RegistryError`` keeps its class name, exit code, message and hint (the client rebuilds
the same error, so the CLI prints the same line). A store failure (``StoreError``: database or
S3) and anything unexpected answer a generic message with an id; the details, traceback
included, go to the server's log only, so no path, URL or stack frame reaches a client.
"""
from __future__ import annotations

import logging
import secrets
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .. import errors as registry_errors
from ..errors import (
    AccessDeniedError,
    ConflictError,
    DatabaseOutdatedError,
    IncompatibleError,
    InputValidationError,
    IntegrityError,
    NotAuthenticatedError,
    NotFoundError,
    RegistryError,
    StoreError,
    UsageError,
)

__all__ = ["error_body", "status_of", "install_error_handlers", "log"]

log = logging.getLogger("registry.server")

#: most specific first
_STATUS: tuple[tuple[type[RegistryError], int], ...] = (
    (NotAuthenticatedError, 401),
    (AccessDeniedError, 403),
    (UsageError, 400),
    (NotFoundError, 404),
    (ConflictError, 409),
    (IncompatibleError, 422),
    (InputValidationError, 422),
    (IntegrityError, 422),
    (StoreError, 503),
)


def status_of(exc: RegistryError) -> int:
    explicit = getattr(exc, "status", None)
    if isinstance(explicit, int):
        return explicit
    for cls, status in _STATUS:
        if isinstance(exc, cls):
            return status
    return 500


def error_body(exc: RegistryError, *, message: str | None = None) -> dict[str, Any]:
    """The wire form of an error (``message`` replaces the exception's own)."""
    # server-side subclasses (BodyTooLarge ...) travel as their registry.errors base class
    typ = next(c.__name__ for c in type(exc).__mro__ if c.__module__ == registry_errors.__name__)
    return {"error": {"type": typ, "exit_code": exc.exit_code,
                      "message": message if message is not None else exc.message,
                      "hint": None if message is not None else exc.hint,
                      "scope": getattr(exc, "scope", None)}}


def _generic(exc: BaseException, request: Request) -> JSONResponse:
    """A generic answer for a failure whose details are for the operator only; the log line
    (traceback included) carries an incident id the answer repeats."""
    incident = secrets.token_hex(4)
    log.error("incident %s: %s %s failed: %s: %s", incident, request.method, request.url.path,
              type(exc).__name__, exc, exc_info=exc)
    shown = exc if isinstance(exc, RegistryError) else RegistryError("internal error")
    return JSONResponse(error_body(shown, message=f"the registry server failed; its log has "
                                                 f"the details under incident {incident}"),
                        status_code=status_of(shown) if isinstance(exc, StoreError) else 500)


def _scrubbed(exc: RegistryError, secrets_to_hide: tuple[str, ...]) -> dict[str, Any]:
    body = error_body(exc)
    for key in ("message", "hint"):
        text = body["error"][key]
        if isinstance(text, str):
            for hidden in secrets_to_hide:
                if hidden:
                    text = text.replace(hidden, "the registry's blob store")
            body["error"][key] = text
    return body


def install_error_handlers(app: FastAPI, *, hide: tuple[str, ...] = ()) -> None:
    """Handlers for RegistryError, FastAPI's validation errors, HTTP errors and anything else.
    ``hide``: strings never to echo (the blob store's URL and root directory)."""

    async def registry_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RegistryError)
        if isinstance(exc, DatabaseOutdatedError):
            log.error("database schema behind head: %s", exc.one_line())
            return JSONResponse(error_body(exc, message="the registry database schema is "
                                           "behind this server; its operator must run "
                                           "`pt2reg db upgrade`"), status_code=503)
        if isinstance(exc, StoreError) or status_of(exc) >= 500:
            return _generic(exc, request)
        return JSONResponse(_scrubbed(exc, hide), status_code=status_of(exc),
                            headers=getattr(exc, "headers", None))  # e.g. Retry-After on a 429

    async def validation_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, RequestValidationError)
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p not in ("query", "path", "body"))
        kind = (first.get("loc") or ("request",))[0]
        text = first.get("msg", "invalid request")
        err = UsageError(f"invalid {kind} parameter {where!r}: {text}" if where else text)
        return JSONResponse(error_body(err), status_code=400)

    async def http_error(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, StarletteHTTPException)
        if exc.status_code == 404:
            err: RegistryError = NotFoundError(f"no such route: {request.method} {request.url.path}",
                                               what="route", hint="see /v1/openapi.json")
        else:
            err = UsageError(f"{request.method} {request.url.path}: {exc.detail}")
            err.status = exc.status_code
        return JSONResponse(error_body(err), status_code=exc.status_code,
                            headers=getattr(exc, "headers", None))

    async def disconnected(request: Request, exc: Exception) -> JSONResponse:
        # the client went away mid-body: nothing to answer, nothing stored, no traceback
        log.info("%s %s: the client disconnected before its body arrived", request.method,
                 request.url.path)
        return JSONResponse(error_body(UsageError("the client disconnected mid-request")),
                            status_code=400)

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        if isinstance(exc, OverflowError):  # a number too large for the database (query/path int)
            return JSONResponse(error_body(UsageError("a number in the request is out of range",
                                                      hint="use a 64-bit signed integer")),
                                status_code=400)
        return _generic(exc, request)

    app.add_exception_handler(RegistryError, registry_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(ClientDisconnect, disconnected)
    app.add_exception_handler(Exception, unexpected)
