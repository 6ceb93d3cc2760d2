"""The audit log: client events (a pull served from a cache) and the chain's reads and verification."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from ...access.scopes import AUDIT_READ
from ...errors import UsageError
from ...refs import validate_digest, validate_name
from ...remote.wire import encode
from .. import fields
from ..auth import Call, on_model, on_scope
from ..client_events import admit_event
from ._common import json_body_doc, server_state

router = APIRouter()

#: the only actions a client records itself (what it served from its cache)
_EVENT_ACTIONS = ("pull", "load")


@router.post("/v1/events", tags=["audit"],
             openapi_extra=json_body_doc(action="string", model="string", number="integer", digest="string",
                                 ref="string", host="string", details="object"))
def record_event(request: Request, call: Call = on_model("pull", "body:model")) -> Any:
    """A pull or load of a version (the events a client records that change no state); rate
    limited per token, bounded in size, about a version that exists (``client_events``)."""
    body = call.body
    action = fields.text(body, "action")
    if action not in _EVENT_ACTIONS:
        raise UsageError(f"event action {action!r} cannot be recorded through the server",
                         hint="pull or load")
    digest = fields.opt_text(body, "digest")
    event = {"model": validate_name(fields.text(body, "model")), "number": fields.opt_number(body, "number"),
             "digest": validate_digest(digest) if digest is not None else None, "ref": fields.opt_text(body, "ref"),
             "details": {**fields.mapping(body, "details"), **call.audit_details()}}
    admit_event(request, call, **event)  # 429, 413, 404 before anything is written
    return encode(server_state(request).meta.record_event(action, actor=call.who.owner, host=call.host(), **event))


# -- audit ------------------------------------------------------------------------------------

@router.get("/v1/audit/events", tags=["audit"])
def audit_events(request: Request, model: str | None = None, since: str | None = None,
                 call: Call = on_scope(AUDIT_READ)) -> dict[str, Any]:
    if model is not None:
        validate_name(model)
    events = server_state(request).meta.events(model=model, since=fields.when(since, "since"))
    return {"events": encode(events)}


@router.get("/v1/audit/hashes", tags=["audit"])
def audit_hashes(request: Request, seqs: str = "", call: Call = on_scope(AUDIT_READ)) -> dict[str, Any]:
    wanted = [s.strip() for s in seqs.split(",") if s.strip()]
    if len(wanted) > 10_000 or not all(s.isdigit() and len(s) < 19 for s in wanted):
        raise UsageError("seqs must be at most 10000 comma-separated event numbers")
    head, found = server_state(request).meta.audit_hashes([int(s) for s in wanted])
    return {"head": list(head) if head else None, "found": {str(k): v for k, v in found.items()}}


@router.get("/v1/audit/verify", tags=["audit"])
def audit_verify(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    return encode(server_state(request).meta.verify_audit_chain())


@router.get("/v1/audit/contents", tags=["audit"])
def audit_contents(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    verdict = server_state(request).meta.verify_version_contents()
    return JSONResponse(encode(verdict) if verdict is not None else None)


