"""Routes for alias policies and conformance attestations (``/v1/policies``, ``/v1/attestations``).

Policy changes need ``admin``; reading a model's policies or a version's attestations needs
``pull`` on it; recording an attestation needs ``attest`` on it (``model:<glob>:attest``: a CI
runner on the target hardware may certify versions without being able to push or move
aliases). The rules themselves are enforced by the store, in the transaction of every alias
move (``registry.store.governance``): these routes only carry them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fastapi import APIRouter, Request

from ..access.scopes import ADMIN
from ..errors import UsageError
from ..refs import validate_alias, validate_name
from ..remote.wire import encode
from ..runtime.device import Device
from . import fields
from .auth import Call, on_model, on_scope
from .routes import json_body_doc, server_state

__all__ = ["router"]

router = APIRouter()
_MAX_PEM = 4096


def _texts(body: dict[str, Any], key: str, limit: int) -> list[str]:
    values = fields.items(body, key, limit=limit)
    if not all(isinstance(v, str) and len(v) <= _MAX_PEM for v in values):
        raise UsageError(f"each of {key!r} must be text of at most {_MAX_PEM} characters")
    return values


@router.put("/v1/policies", tags=["governance"],
            openapi_extra=json_body_doc(name="string", alias="string", role_scope="string", signers="array",
                                attestations="array", immutable="boolean", host="string"))
def set_policy(request: Request, call: Call = on_scope(ADMIN)) -> Any:
    """Create or replace the policy on one alias (``signers``: Ed25519 public keys, PEM)."""
    body = call.body
    return encode(server_state(request).meta.set_policy(
        validate_name(fields.text(body, "name")), validate_alias(fields.text(body, "alias")),
        role_scope=fields.opt_text(body, "role_scope"), signers=_texts(body, "signers", 16),
        attestations=_texts(body, "attestations", 32), immutable=fields.flag(body, "immutable"),
        **call.writer()))


@router.delete("/v1/policies", tags=["governance"])
def remove_policy(request: Request, name: str, alias: str, host: str | None = None,
                  call: Call = on_scope(ADMIN)) -> Any:
    return encode(server_state(request).meta.remove_policy(validate_name(name), validate_alias(alias),
                                                     **call.writer()))


@router.get("/v1/policies", tags=["governance"])
def policies(request: Request, name: str, call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    return {"policies": encode(server_state(request).meta.policies(name))}


@router.post("/v1/attestations", tags=["governance"],
             openapi_extra=json_body_doc(name="string", number="integer", label="string", passed="boolean",
                                 device="string", target="object", results="array", error="string",
                                 signature="object", public_key="string", host="string"))
def record_attestation(request: Request, call: Call = on_model("attest", "body:name")) -> Any:
    """Record an attestation; a signed one is verified before it is stored (exit 5 if not)."""
    body = call.body
    passed = body.get("passed")
    if not isinstance(passed, bool):
        raise UsageError("'passed' must be true or false")
    return encode(server_state(request).meta.record_attestation(
        validate_name(fields.text(body, "name")), fields.number(body, "number"),
        label=fields.text(body, "label", max_len=64), passed=passed,
        device=_device(body), target=fields.mapping(body, "target"),
        results=fields.items(body, "results", limit=10_000), error=fields.opt_text(body, "error"),
        signature=fields.opt_mapping(body, "signature"),
        public_key=fields.opt_text(body, "public_key", max_len=_MAX_PEM), **call.writer()))


def _device(body: Mapping[str, Any]) -> str:
    """The attestation's device, as the one device parser reads it (``Device.parse``), in its
    canonical text (``cuda:0``): the text a signed statement covers, so it is kept, not rewritten."""
    text = fields.text(body, "device", max_len=64)
    device = Device.try_parse(text)
    if device is None or str(device) != text:
        raise UsageError(f"field 'device' must be a torch device like cpu or cuda:0, got {text[:64]!r}")
    return text


@router.get("/v1/attestations", tags=["governance"])
def attestations(request: Request, name: str, number: int,
                 call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    return {"attestations": encode(server_state(request).meta.attestations(name, number))}
