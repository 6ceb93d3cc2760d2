"""What every route module shares: the server's state and the OpenAPI shape of a JSON body."""
from __future__ import annotations

from typing import Any

from fastapi import Request

from ..state import ServerState

__all__ = ["server_state", "json_body_doc"]



def server_state(request: Request) -> ServerState:
    return request.app.state.registry


def json_body_doc(**props: str) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a JSON body read by the route (``name="string"`` ...)."""
    def schema(kind: str) -> dict[str, Any]:
        return {"type": "array", "items": {}} if kind == "array" else {"type": kind}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": {k: schema(v) for k, v in props.items()}}}}}}



