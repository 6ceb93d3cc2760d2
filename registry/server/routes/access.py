"""Tokens: create, list, revoke (``admin``)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ...access.scopes import ADMIN
from ...errors import UsageError
from ...remote.wire import encode
from .. import fields
from ..auth import Call, on_scope
from ._common import json_body_doc, server_state

router = APIRouter()


# -- tokens -----------------------------------------------------------------------------------

@router.post("/v1/tokens", tags=["admin"],
             openapi_extra=json_body_doc(owner="string", scopes="array", expires_at="string", host="string"))
def create_token(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    body = call.body
    scopes = fields.items(body, "scopes", limit=100)
    if not all(isinstance(s, str) for s in scopes):
        raise UsageError("'scopes' must be a list of scope strings")
    record, secret = server_state(request).meta.create_token(
        fields.text(body, "owner", max_len=64), scopes,
        expires_at=fields.when(fields.opt_text(body, "expires_at"), "expires_at"), **call.writer())
    return {"token": encode(record), "secret": secret}


@router.get("/v1/tokens", tags=["admin"])
def list_tokens(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    return {"tokens": encode(server_state(request).meta.list_tokens())}


@router.delete("/v1/tokens/{token_id}", tags=["admin"])
def revoke_token(request: Request, token_id: int, host: str | None = None,
                 call: Call = on_scope(ADMIN)) -> Any:
    return encode(server_state(request).meta.revoke_token(token_id, **call.writer()))


