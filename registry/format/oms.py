"""Signatures over statements in the OpenSSF Model Signing (OMS) v1.0 format.

What a key signs is an in-toto Statement v1 (predicate type
``https://model_signing/signature/v1.0``) whose resources are the bundle's canonical
``manifest.json`` and every member file, each by its sha256, as ``model_signing`` lists a model
directory (``pt2reg materialize --layout files`` writes exactly that directory). Beside the
v1.0 fields (``serialization``, ``resources``: every v1.0 verifier reads only those) the
predicate carries ``pt2reg``: the model name, the version number, the bundle digest and the
signing time, so a signature says *what* it vouches for, not only which bytes::

    {"_type": "https://in-toto.io/Statement/v1",
     "subject": [{"name": "team/m", "digest": {"sha256": "<over the resources' digests>"}}],
     "predicateType": "https://model_signing/signature/v1.0",
     "predicate": {"serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": false},
                   "resources": [{"name": "manifest.json", "algorithm": "sha256", "digest": "<hex>"}, ...],
                   "pt2reg": {"model": "team/m", "version": 4, "digest": "sha256:<hex>",
                              "signed_at": "2026-12-04T19:00:00Z"}}}

It is signed as DSSE (the PAE of the JSON payload) with an ECDSA (P-256/384/521) or Ed25519
key and stored as the Sigstore bundle ``model_signing``'s key method writes (media type
``application/vnd.dev.sigstore.bundle.v0.3+json``, ``verificationMaterial.publicKey.hint`` the
sha256 of the public key's PEM, no transparency log). So ``model_signing verify key`` checks our
signatures of ECDSA keys over a materialized directory, and ours verify what it signs (its
statements name no model here: ``Statement.model`` is None). This module is the codec; keys
and policies are ``registry.format.signing``'s and ``registry.client.trust``'s. The reference
implementation is a test dependency (``tests/integration/test_signing_oms.py``), not a runtime
one: it would bring sigstore, TUF, pydantic and protobuf to every inference host for ~200 lines.
"""
from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SignatureError

__all__ = ["PREDICATE_TYPE", "STATEMENT_TYPE", "PAYLOAD_TYPE", "BUNDLE_MEDIA_TYPE", "MANIFEST_RESOURCE",
           "Statement", "statement_payload", "sign_statement", "open_bundle", "pae", "MAX_BUNDLE_BYTES", "claimed"]

PREDICATE_TYPE = "https://model_signing/signature/v1.0"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
#: the resource that binds the statement to a bundle: the canonical manifest, whose sha256 is
#: the bundle's digest
MANIFEST_RESOURCE = "manifest.json"
#: a signature record's bundle text is refused above this (statements list a few members)
MAX_BUNDLE_BYTES = 1 << 20


@dataclass(frozen=True)
class Statement:
    """What a verified OMS signature vouches for. ``model``/``version``/``signed_at`` come from
    the ``pt2reg`` part of the predicate (None in a statement made by another OMS signer);
    ``digest`` is the bundle digest its ``manifest.json`` resource binds (None when it lists
    none); ``resources``: name -> sha256 hex of everything it lists."""

    subject: str
    digest: str | None
    resources: Mapping[str, str]
    model: str | None = None
    version: int | None = None
    signed_at: str | None = None

    @property
    def binds_model(self) -> bool:
        return self.model is not None and self.version is not None


def pae(payload: bytes, payload_type: str = PAYLOAD_TYPE) -> bytes:
    """DSSE's pre-authentication encoding (what the key signs)."""
    head = f"DSSEv1 {len(payload_type.encode())} {payload_type} {len(payload)} ".encode()
    return head + payload


def _root_digest(resources: Mapping[str, str]) -> str:
    """The subject digest ``model_signing`` computes: sha256 over the resources' raw digests,
    in name order."""
    h = hashlib.sha256()
    for name in sorted(resources):
        h.update(bytes.fromhex(resources[name]))
    return h.hexdigest()


def statement_payload(*, model: str, version: int, digest: str, members: Mapping[str, str],
                      signed_at: str) -> bytes:
    """The payload (JSON bytes) of a statement for version ``model@version`` whose canonical
    manifest hashes to ``digest`` (``sha256:<hex>``), ``members``: member path -> sha256 hex of
    the member file."""
    resources = {MANIFEST_RESOURCE: digest.split(":", 1)[1], **dict(members)}
    doc = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": model, "digest": {"sha256": _root_digest(resources)}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False},
            "resources": [{"name": n, "algorithm": "sha256", "digest": resources[n]} for n in sorted(resources)],
            "pt2reg": {"model": model, "version": int(version), "digest": digest, "signed_at": signed_at},
        },
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode("utf-8")


def sign_statement(private_key: Any, payload: bytes) -> dict[str, Any]:
    """The Sigstore bundle (a JSON object) of ``payload`` signed with ``private_key``."""
    from .keys import public_pem_bytes, sign_bytes

    signature = sign_bytes(private_key, pae(payload))
    hint = hashlib.sha256(public_pem_bytes(private_key.public_key())).hexdigest()
    return {"mediaType": BUNDLE_MEDIA_TYPE,
            "verificationMaterial": {"publicKey": {"hint": hint}, "tlogEntries": []},
            "dsseEnvelope": {"payload": base64.b64encode(payload).decode("ascii"), "payloadType": PAYLOAD_TYPE,
                             "signatures": [{"sig": base64.b64encode(signature).decode("ascii")}]}}


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise SignatureError(f"the OMS signature's {what} is not base64 text")
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise SignatureError(f"the OMS signature's {what} is not base64") from None


def open_bundle(bundle: str | Mapping[str, Any], public_key: Any) -> Statement:
    """Verify a Sigstore bundle under ``public_key`` and return what its statement vouches
    for; ``SignatureError`` (exit 5) for anything malformed, a signature that does not verify,
    a key hint that names another key, or a statement that is not OMS v1.0."""
    from .keys import public_pem_bytes, verify_bytes

    if isinstance(bundle, str):
        if len(bundle) > MAX_BUNDLE_BYTES:
            raise SignatureError("the OMS signature is over 1 MiB")
        try:
            bundle = json.loads(bundle)
        except ValueError:
            raise SignatureError("the OMS signature is not JSON") from None
    if not isinstance(bundle, Mapping) or bundle.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise SignatureError(f"the OMS signature is not a Sigstore bundle ({BUNDLE_MEDIA_TYPE})")
    material = bundle.get("verificationMaterial")
    hint = material.get("publicKey", {}).get("hint") if isinstance(material, Mapping) and \
        isinstance(material.get("publicKey"), Mapping) else None
    if hint and hint != hashlib.sha256(public_pem_bytes(public_key)).hexdigest():
        raise SignatureError("the OMS signature names another public key")
    envelope = bundle.get("dsseEnvelope")
    if not isinstance(envelope, Mapping) or envelope.get("payloadType") != PAYLOAD_TYPE:
        raise SignatureError("the OMS signature holds no in-toto DSSE envelope")
    signatures = envelope.get("signatures")
    if not isinstance(signatures, list) or len(signatures) != 1 or not isinstance(signatures[0], Mapping):
        raise SignatureError("the OMS signature must hold exactly one signature")
    payload = _b64(envelope.get("payload"), "payload")
    if not verify_bytes(public_key, _b64(signatures[0].get("sig"), "signature"), pae(payload)):
        raise SignatureError("the OMS signature does not verify under its key")
    return _statement(payload)


def _statement(payload: bytes) -> Statement:
    try:
        doc = json.loads(payload)
    except ValueError:
        raise SignatureError("the OMS statement is not JSON") from None
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_TYPE or doc.get("predicateType") != PREDICATE_TYPE:
        raise SignatureError(f"the signed statement is not an OMS v1.0 statement ({PREDICATE_TYPE})")
    subject, predicate = doc.get("subject"), doc.get("predicate")
    if not isinstance(subject, list) or len(subject) != 1 or not isinstance(subject[0], dict) \
            or not isinstance(predicate, dict) or not isinstance(predicate.get("resources"), list):
        raise SignatureError("the OMS statement has no single subject or no resources")
    resources: dict[str, str] = {}
    for r in predicate["resources"]:
        if not isinstance(r, dict) or r.get("algorithm") != "sha256" or not isinstance(r.get("name"), str) \
                or not isinstance(r.get("digest"), str) or len(r["digest"]) != 64 or r["name"] in resources:
            raise SignatureError("the OMS statement lists a resource that is not a unique sha256 entry")
        try:
            bytes.fromhex(r["digest"])
        except ValueError:
            raise SignatureError("the OMS statement lists a digest that is not hex") from None
        resources[r["name"]] = r["digest"].lower()
    root = (subject[0].get("digest") or {}).get("sha256") if isinstance(subject[0].get("digest"), dict) else None
    if root != _root_digest(resources):  # model_signing's own consistency rule
        raise SignatureError("the OMS statement's subject digest does not match its resources")
    manifest = resources.get(MANIFEST_RESOURCE)
    extra = predicate.get("pt2reg") if isinstance(predicate.get("pt2reg"), dict) else {}
    model, version, digest = extra.get("model"), extra.get("version"), extra.get("digest")
    bound_digest = f"sha256:{manifest}" if manifest else None
    if extra and (digest != bound_digest or not isinstance(model, str)
                  or not isinstance(version, int) or isinstance(version, bool) or version < 1):
        raise SignatureError("the OMS statement's pt2reg part does not match its resources")
    signed_at = extra.get("signed_at") if isinstance(extra.get("signed_at"), str) else None
    return Statement(str(subject[0].get("name", "")), bound_digest, resources, model if extra else None,
                     version if extra else None, signed_at)


def claimed(bundle_text: str) -> tuple[str | None, int | None]:
    """(model, version) a signature's statement *claims*, read without verifying it (the
    store has no keys): enough to refuse recording a statement for ``team/m@5`` as version 6's
    signature. (None, None) for anything it cannot read."""
    try:
        bundle = json.loads(bundle_text) if len(bundle_text) <= MAX_BUNDLE_BYTES else None
        payload = json.loads(base64.b64decode(bundle["dsseEnvelope"]["payload"], validate=True))
        extra = payload["predicate"]["pt2reg"]
        model, version = extra.get("model"), extra.get("version")
    except (ValueError, KeyError, TypeError, AttributeError):
        return None, None
    ok = isinstance(model, str) and isinstance(version, int) and not isinstance(version, bool)
    return (model, version) if ok else (None, None)
