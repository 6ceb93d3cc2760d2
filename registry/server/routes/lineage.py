"""Lineage: a version's ancestors and descendants, and a dataset's versions, redacted to what the caller may see."""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from typing import Any

from fastapi import APIRouter, Request

from ...errors import UsageError
from ...refs import Ref, validate_digest
from ...remote.wire import encode
from ...store.records import LineageNode
from ..auth import Call, authenticated, on_model
from ._common import server_state

router = APIRouter()

_DIRECTIONS = ("ancestors", "descendants")
#: the key of this server's stand-ins for digests a caller may not see (one per process)
_RESTRICTED_KEY = secrets.token_bytes(32)


def redacted_node(node: LineageNode, call: Call) -> LineageNode:
    """A node of a model the token may not pull: its place in the graph, nothing else. Its
    digest is replaced by an opaque id (``restricted:<hex>``, an HMAC of it under a key of
    this process), so two paths to the same hidden version still meet in a graph, while the
    content address, which would confirm a guess of what the version holds, is not shown."""
    if call.who.allows("pull", node.name):
        return dataclasses.replace(node, edges=[_edge_redacted(e, call) for e in node.edges])
    return LineageNode(name="restricted", number=0, digest=_stand_in(node.digest), status="restricted",
                       depth=node.depth,
                       edges=[_edge_redacted(e, call) for e in node.edges if e.kind == "parent"])


def _stand_in(digest: str | None) -> str | None:
    """The opaque id a restricted version's digest is shown as (the same wherever it appears,
    so a parent edge still names its node)."""
    if not digest:
        return digest
    return "restricted:" + hmac.new(_RESTRICTED_KEY, digest.encode(), hashlib.sha256).hexdigest()[:32]


def _edge_redacted(edge: Any, call: Call) -> Any:
    if edge.kind != "parent":
        return edge
    try:
        parent = Ref.parse(edge.value).name
    except UsageError:
        parent = None
    if parent is not None and call.who.allows("pull", parent):
        return edge
    return dataclasses.replace(edge, value="restricted", digest=_stand_in(edge.digest), extra=None)


@router.get("/v1/lineage", tags=["lineage"])
def lineage(request: Request, name: str, number: int, direction: str = "ancestors",
            call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    """Ancestors or descendants; nodes of models the token may not pull are redacted."""
    if direction not in _DIRECTIONS:
        raise UsageError(f"invalid direction {direction!r}", hint="ancestors or descendants")
    meta = server_state(request).meta
    nodes = meta.ancestors(name, number) if direction == "ancestors" else meta.descendants(name, number)
    return {"nodes": encode([redacted_node(n, call) for n in nodes])}


@router.get("/v1/lineage/dataset", tags=["lineage"])
def dataset_lineage(request: Request, uri: str, digest: str | None = None,
                    call: Call = authenticated()) -> dict[str, Any]:
    """Versions trained on a dataset and what derives from them, only models the token may pull."""
    if len(uri) > 4096:
        raise UsageError("dataset URI is longer than 4096 characters")
    if digest is not None:
        validate_digest(digest)
    nodes = server_state(request).meta.versions_from_dataset(uri, digest=digest)
    return {"nodes": encode([redacted_node(n, call) for n in nodes if call.who.allows("pull", n.name)])}


