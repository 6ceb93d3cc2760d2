"""Blobs: where to upload and download them, the server's own blob routes, chunk locations."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from ...errors import UsageError
from ...refs import validate_digest, validate_name
from .. import blobio, fields, ownership
from ..auth import Call, on_blobs, on_model
from ._common import json_body_doc, server_state

router = APIRouter()


# -- blobs ------------------------------------------------------------------------------------

def _blob_items(body: dict[str, Any], limit: int) -> list[tuple[str, int]]:
    out = []
    for item in fields.items(body, "blobs", limit=limit):
        if not isinstance(item, dict):
            raise UsageError("each of 'blobs' must be {digest, size}")
        size = fields.number(item, "size")
        if size < 0:
            raise UsageError(f"invalid size {size} for blob {item.get('digest')!r}")
        out.append((validate_digest(fields.text(item, "digest")), size))
    return out


@router.post("/v1/blobs/upload", tags=["blobs"],
             openapi_extra=json_body_doc(blobs="array", name="string"))
def upload_blobs(request: Request,
                 call: Call = on_model("push", "body:name", optional=True)) -> dict[str, Any]:
    """Which blobs the store lacks, each with where to PUT it (a presigned S3 URL, or this
    server's own ``/v1/blobs/{digest}`` for a local store). A stored blob this token may not
    adopt (``ownership``) is asked for like a missing one: its bytes are the proof."""
    state = server_state(request)
    items = _blob_items(call.body, state.limits.batch_items)
    too_big = [d for d, n in items if n > state.limits.blob_body]
    if too_big and not state.presigns:
        raise UsageError(f"blob {too_big[0]} is larger than this server's limit of "
                         f"{state.limits.blob_body} bytes per blob")
    present = ownership.adoptable(state, call.who, items, ownership.own_claims(state, call.who))
    return blobio.upload_plan(state, request, items, present=present, uploader=ownership.uploader_tag(call.who))


@router.post("/v1/chunks/locate", tags=["blobs"],
             openapi_extra=json_body_doc(digests="array", name="string"))
def locate_chunks(request: Request, call: Call = on_model("push", "body:name")) -> dict[str, Any]:
    """Where each chunk is stored inside a pack (``[pack, pack size, offset, size]``) of the
    model ``name`` a push is pushing to (the token may push to it), for a push that would
    otherwise store the chunk again. Only that model's packs (see ``locate_chunks``)."""
    state = server_state(request)
    name = validate_name(fields.text(call.body, "name"))
    digests = [validate_digest(d) for d in fields.items(call.body, "digests", limit=state.limits.batch_items)]
    found = state.meta.locate_chunks(digests, name=name)
    return {"locations": {c: [loc.pack, loc.pack_size, loc.offset, loc.size] for c, loc in found.items()}}


@router.post("/v1/blobs/download", tags=["blobs"],
             openapi_extra=json_body_doc(digests="array"))
def download_blobs(request: Request, call: Call = on_blobs("body:digests")) -> dict[str, Any]:
    """Where to GET each blob: presigned S3 URLs, or this server's own URLs."""
    digests = [validate_digest(d) for d in call.body["digests"]]
    return blobio.download_urls(server_state(request), request, digests)


@router.put("/v1/blobs/{digest}", tags=["blobs"],
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def put_blob(request: Request, digest: str,
                   call: Call = on_model("push", json_body=False)) -> dict[str, Any]:
    """One blob's bytes (local store only), verified while written, and noted as this token's
    upload in its claims that list the blob (``ownership``)."""
    state = server_state(request)
    answer = await blobio.receive_blob(state, request, validate_digest(digest))
    await run_in_threadpool(ownership.record_upload, state, call.who, digest)
    return answer


@router.get("/v1/blobs/{digest}", tags=["blobs"])
def get_blob(request: Request, digest: str, call: Call = on_blobs("path:digest")) -> Response:
    """The bytes (``Range`` supported), or a 307 to a presigned S3 GET."""
    return blobio.serve_blob(server_state(request), request, digest)


@router.head("/v1/blobs/{digest}", tags=["blobs"])
def head_blob(request: Request, digest: str,
              call: Call = on_blobs("path:digest", or_action="push")) -> Response:
    return blobio.head_blob(server_state(request), digest)
