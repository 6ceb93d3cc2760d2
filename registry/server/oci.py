"""Routes for OCI artifacts (``/v1/oci``): where versions were pushed as ModelPack artifacts.

Recording a push needs ``push`` on the model (the same right that publishes it); reading where a
version went needs ``pull`` on it; the repositories of a host (where a push may mount blobs
from) are those of models the caller may pull, nothing about the others.
"""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ..errors import UsageError
from ..oci.reference import OciReference
from ..refs import validate_digest, validate_name
from ..remote.wire import encode
from . import fields
from .auth import Call, authenticated, on_model
from .routes import json_body_doc, server_state

__all__ = ["router"]

router = APIRouter()


def _location(text: str) -> str:
    """``HOST/REPOSITORY`` as ``OciReference`` reads it (no tag or digest)."""
    try:
        ref = OciReference.parse(text)
    except UsageError as exc:
        raise UsageError(f"field 'location': {exc.message}", hint="HOST/REPOSITORY, e.g. ghcr.io/team/m") from None
    if ref.tag is not None or ref.digest is not None or ref.location != text.lower():
        raise UsageError(f"field 'location' must be HOST/REPOSITORY, got {text[:80]!r}")
    return ref.location


@router.post("/v1/oci", tags=["oci"],
             openapi_extra=json_body_doc(name="string", number="integer", location="string", tag="string",
                                         manifest_digest="string", host="string"))
def record_oci(request: Request, call: Call = on_model("push", "body:name")) -> dict[str, Any]:
    """Record that a version was pushed to an OCI registry (``pt2reg oci push``), audited as ``oci.push``."""
    body = call.body
    tag = fields.opt_text(body, "tag", max_len=128)
    if tag is not None:
        try:
            OciReference.parse(f"h.io/r:{tag}")   # a tag as the distribution spec writes one
        except UsageError:
            raise UsageError(f"field 'tag' is not an OCI tag: {tag[:80]!r}") from None
    record = server_state(request).meta.record_oci_artifact(
        validate_name(fields.text(body, "name")), fields.number(body, "number"),
        location=_location(fields.text(body, "location", max_len=255)), tag=tag,
        manifest_digest=validate_digest(fields.text(body, "manifest_digest", max_len=71)), **call.writer())
    return {"artifact": encode(record)}


@router.get("/v1/oci", tags=["oci"])
def oci_artifacts(request: Request, name: str, number: int,
                  call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    return {"artifacts": encode(server_state(request).meta.oci_artifacts(name, number))}


@router.get("/v1/oci/repositories", tags=["oci"])
def oci_repositories(request: Request, host: str, call: Call = authenticated()) -> dict[str, Any]:
    if not host or len(host) > 255:
        raise UsageError("query 'host' must be a registry host")
    pairs = server_state(request).meta.oci_locations(host)
    return {"repositories": list(dict.fromkeys(repo for repo, model in pairs if call.who.allows("pull", model)))}
