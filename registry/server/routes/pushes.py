"""Push claims (``/v1/pending``: what gc spares while a push uploads) and gc."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ...access.scopes import ADMIN
from ...errors import AccessDeniedError, UsageError
from ...refs import validate_digest
from ...remote.wire import encode
from .. import fields, ownership
from ..auth import Call, on_model, on_scope
from ._common import json_body_doc, server_state

router = APIRouter()


# -- push claims and gc -----------------------------------------------------------------------

@router.post("/v1/pending", tags=["push"],
             openapi_extra=json_body_doc(blobs="array", host="string", pid="integer", name="string"))
def begin_pending(request: Request,
                  call: Call = on_model("push", "body:name", optional=True)) -> dict[str, Any]:
    """Claim blobs a push is uploading. The claim's host reads ``remote:t<token id>:<host>``:
    gc judges a remote claim by its heartbeats (never by a process id on the server's own
    machine), and only the token that made a claim (or an admin) may refresh or end it. The
    model it pushes (``name``) is recorded: who may push or pull it may use what the claim
    uploads (``ownership``)."""
    body = call.body
    limit = server_state(request).limits.batch_items
    blobs = [validate_digest(d) for d in fields.items(body, "blobs", limit=limit)]
    pid = fields.number(body, "pid")
    name = fields.opt_text(body, "name")  # checked by the permission: the token may push it
    host = f"{ownership.claim_prefix(call.who)}{call.host()}"[:256]
    return {"id": server_state(request).meta.begin_pending(blobs, host, pid, name=name)}


def _own_claim(request: Request, call: Call, claim_id: int) -> None:
    """AccessDeniedError when the claim exists and another token made it (admins may)."""
    claim = ownership.claim_of(server_state(request), claim_id)
    if claim is not None and not ownership.is_own(call.who, claim):
        raise AccessDeniedError(f"push claim {claim_id} belongs to another token",
                                scope="admin", hint="a push refreshes and ends only its own claim")


@router.post("/v1/pending/{claim_id}/heartbeat", tags=["push"])
def heartbeat_pending(request: Request, claim_id: int, call: Call = on_model("push")) -> dict[str, Any]:
    _own_claim(request, call, claim_id)
    return {"alive": server_state(request).meta.heartbeat_pending(claim_id)}


@router.delete("/v1/pending/{claim_id}", tags=["push"])
def end_pending(request: Request, claim_id: int, call: Call = on_model("push")) -> dict[str, Any]:
    _own_claim(request, call, claim_id)
    server_state(request).meta.end_pending(claim_id)
    return {}


@router.post("/v1/gc", tags=["admin"],
             openapi_extra=json_body_doc(dry_run="boolean", grace_seconds="number", host="string"))
def gc(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    """Collect garbage on the server's stores, audited as the token's owner."""
    from ...client.gc import collect_garbage

    state = server_state(request)
    grace = call.body.get("grace_seconds", 0.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise UsageError("grace_seconds must be a number of seconds >= 0")
    result = collect_garbage(state.meta, state.blobs, dry_run=fields.flag(call.body, "dry_run"),
                             grace_seconds=float(grace), **call.writer())
    return {**encode(result), "reclaimed_bytes": result.reclaimed_bytes}


