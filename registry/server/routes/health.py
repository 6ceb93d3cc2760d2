"""Health, readiness, who and when: ``/healthz``, ``/readyz``, ``/v1/whoami``, ``/v1/now``, ``/v1/stats``."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ...access.scopes import ADMIN
from ...remote.wire import encode
from ...store.migrate import HEAD_REVISION, ensure_schema
from ..auth import Call, authenticated, on_scope, public
from ._common import server_state

router = APIRouter()


# -- health -----------------------------------------------------------------------------------

@router.get("/healthz", tags=["health"])
def healthz(call: Call = public()) -> dict[str, Any]:
    """The process answers."""
    return {"ok": True}


@router.get("/readyz", tags=["health"])
def readyz(request: Request, call: Call = public()) -> Any:
    """Ready when the database answers and its schema is at head (503 otherwise)."""
    ensure_schema(server_state(request).meta.engine, auto_create=False)
    return {"ok": True, "schema": HEAD_REVISION}


@router.get("/v1/openapi.json", tags=["health"], include_in_schema=False)
def openapi_document(request: Request, call: Call = public()) -> Any:
    return request.app.openapi()


# -- who and when -----------------------------------------------------------------------------

@router.get("/v1/whoami", tags=["access"])
def whoami(call: Call = authenticated()) -> dict[str, Any]:
    who = call.who
    return {"owner": who.owner, "token_id": who.token_id, "scopes": [s.text for s in who.scopes],
            "expires_at": encode(who.expires_at)}


@router.get("/v1/now", tags=["access"])
def now(request: Request, call: Call = authenticated()) -> dict[str, Any]:
    """The database's clock (push claims are judged by it)."""
    return {"now": encode(server_state(request).meta.db_now())}


@router.get("/v1/stats", tags=["admin"])
def stats(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    """Blob bytes this process streamed itself, and presigned URLs it signed."""
    return server_state(request).counters.snapshot()


