"""Signing keys, and signatures over bundles: OMS statements (``oms-v1``) and bare digests.

Keys are Ed25519 or ECDSA (P-256, P-384, P-521), PEM files as ``pt2reg key generate`` writes
them (``--type``; ECDSA P-256 by default, the curve the OpenSSF Model Signing key method
verifies). A key's id is ``sha256:`` of its raw public bytes (Ed25519) or of its DER
SubjectPublicKeyInfo (ECDSA).

A bundle signature is a record in the version's signatures (and a bundle's
``signatures.json``)::

    {"algorithm": "oms-v1", "key_id": "sha256:<key id>", "digest": "sha256:<bundle digest>",
     "signature": "<Sigstore bundle JSON: a DSSE-signed in-toto statement, registry.format.oms>"}

The statement names the model, the version, the bundle digest and the signing time, so a
signature cannot be carried to another model or version. Older signatures cover the bare
digest (``b"pt2-registry/bundle/v1\\n" + digest``, domain-separated): ``ed25519`` (base64 of 64
bytes) and ``ecdsa`` (base64 of a DER signature). They still verify, shown as *legacy*, but
name no model: a trust rule accepts them only when it says ``legacy = true``
(``registry.client.trust``). Attestations and audit heads sign their own statements' digests
the bare way. For example::

    generate_keypair("ci")                    # writes ci.key (0600) and ci.pub
    sig = sign_digest("ci.key", "sha256:ab...")
"""
from __future__ import annotations

import base64
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..errors import SignatureError
from .keys import (
    KEY_ID_RE,
    KEY_TYPES,
    generate_keypair,
    key_id_of,
    load_private_key,
    load_public_key,
    public_key_from_pem,
    public_pem_bytes,
    read_key_file,
    sign_bytes,
    verify_bytes,
)

__all__ = ["generate_keypair", "sign_digest", "verify_signatures", "key_id_of", "KEY_TYPES",
           "public_key_from_pem", "valid_signer", "read_public_key_file", "public_pem_of",
           "load_private_key", "sign_bytes", "verify_bytes", "public_pem_bytes", "OMS", "LEGACY_ALGORITHMS",
           "SignatureCheck", "check_signatures", "sign_statement_record"]

_DOMAIN = b"pt2-registry/bundle/v1\n"
ALGORITHM = "ed25519"
ECDSA = "ecdsa"
OMS = "oms-v1"
#: bare-digest signatures: they name no model or version
LEGACY_ALGORITHMS = (ALGORITHM, ECDSA)


def _message(digest: str) -> bytes:
    return _DOMAIN + digest.encode("ascii")


def check_signature_entries(digest: str, signatures: Iterable[Any]) -> list[dict[str, str]]:
    """Refuse malformed signature entries before they are recorded (SignatureError, exit 5).

    Only the form can be checked here: whether a signature is genuine needs the signer's public
    key, which a trust policy or ``--require-signature KEY`` supplies when it is used.
    """
    out = []
    for i, s in enumerate(signatures):
        if not isinstance(s, dict):
            raise SignatureError(f"signature #{i + 1} is not an object")
        key_id, sig, algorithm = s.get("key_id"), s.get("signature"), s.get("algorithm")
        if algorithm not in (OMS, *LEGACY_ALGORITHMS) or not isinstance(key_id, str) or not KEY_ID_RE.match(key_id):
            raise SignatureError(f"signature #{i + 1} is not an {OMS}, {ALGORITHM} or {ECDSA} signature with a "
                                 f"sha256 key id", hint="sign with `pt2reg sign REF --key KEY` (or push --sign)")
        if s.get("digest", digest) != digest:
            raise SignatureError(f"signature #{i + 1} (by {key_id[:19]}...) is for {str(s.get('digest'))[:80]}, "
                                 f"not this bundle ({digest})", hint="the signature belongs to another bundle")
        if not _well_formed(algorithm, sig):
            what = {ALGORITHM: f"a 64-byte {ALGORITHM} signature in base64", ECDSA: "a DER ecdsa signature in "
                    "base64", OMS: "an oms-v1 Sigstore bundle (JSON, at most 1 MiB)"}[algorithm]
            raise SignatureError(f"signature #{i + 1} (by {key_id[:19]}...) is not {what}",
                                 hint="the signature was damaged or forged")
        out.append({"algorithm": algorithm, "key_id": key_id, "digest": digest, "signature": sig})
    return out


def _well_formed(algorithm: str, sig: Any) -> bool:
    if not isinstance(sig, str):
        return False
    if algorithm == OMS:
        import json

        from .oms import BUNDLE_MEDIA_TYPE, MAX_BUNDLE_BYTES

        try:
            doc = json.loads(sig) if len(sig) <= MAX_BUNDLE_BYTES else None
        except ValueError:
            return False
        return isinstance(doc, dict) and doc.get("mediaType") == BUNDLE_MEDIA_TYPE
    try:
        raw = base64.b64decode(sig, validate=True)
    except ValueError:
        return False
    return len(raw) == 64 if algorithm == ALGORITHM else 8 <= len(raw) <= 160


@dataclass(frozen=True)
class SignatureCheck:
    """One signature by a known key, checked: ``valid`` (the bytes verify and it is for this
    digest), ``kind`` (``OMS`` or ``legacy``), what an OMS statement names (``model``,
    ``version``, ``signed_at``; None for a legacy one or another signer's statement) and, when
    it is not acceptable, why (``problem``)."""

    key_id: str
    algorithm: str
    valid: bool
    model: str | None = None
    version: int | None = None
    signed_at: str | None = None
    problem: str | None = None

    @property
    def kind(self) -> str:
        return "OMS" if self.algorithm == OMS else "legacy"

    @property
    def bound(self) -> bool:
        """It names the model and version it vouches for (an OMS statement of ours)."""
        return self.valid and self.model is not None and self.version is not None


def check_signatures(digest: str, signatures: Iterable[Mapping[str, Any]], keys: Mapping[str, Any], *,
                     name: str | None = None, version: int | None = None) -> list[SignatureCheck]:
    """Each signature by one of ``keys`` (key id -> public key) over bundle ``digest``,
    checked; an OMS statement naming another model than ``name`` or another version than
    ``version`` (when given) is not valid for them. Signatures by other keys are left out."""
    from .oms import open_bundle

    out = []
    for s in signatures:
        key = keys.get(str(s.get("key_id"))) if isinstance(s, Mapping) else None
        if key is None:
            continue
        kid, algorithm, who = str(s["key_id"]), str(s.get("algorithm")), f"{str(s['key_id'])[:19]}..."
        if s.get("digest") not in (None, digest):
            out.append(SignatureCheck(kid, algorithm, False, problem=f"signature by {who} is for another digest"))
        elif algorithm == OMS:
            try:
                st = open_bundle(str(s.get("signature", "")), key)
            except SignatureError as exc:
                out.append(SignatureCheck(kid, algorithm, False, problem=f"OMS signature by {who} is invalid: "
                                                                         f"{exc.message}"))
                continue
            problem = None
            if st.digest != digest:
                problem = f"OMS signature by {who} covers another bundle ({st.digest})"
            elif st.model is not None and name is not None and st.model != name:
                problem = f"OMS signature by {who} names model {st.model}, not {name}"
            elif st.version is not None and version is not None and st.version != version:
                problem = f"OMS signature by {who} names version {st.model}@{st.version}, not @{version}"
            out.append(SignatureCheck(kid, algorithm, problem is None, st.model, st.version, st.signed_at, problem))
        elif algorithm in LEGACY_ALGORITHMS:
            try:
                ok = verify_bytes(key, base64.b64decode(str(s.get("signature", "")), validate=True), _message(digest))
            except ValueError:
                ok = False
            out.append(SignatureCheck(kid, algorithm, ok, problem=None if ok else f"signature by {who} is invalid"))
    return out


def valid_signer(digest: str, signatures: Iterable[Mapping[str, Any]], keys: Mapping[str, Any], *,
                 name: str | None = None, version: int | None = None,
                 bound: bool = False) -> tuple[str | None, str]:
    """(key id of the first of ``keys`` (key id -> public key) with an acceptable signature
    over ``digest``, or None with why not). ``bound``: only an OMS statement naming ``name``
    and ``version`` is acceptable (a legacy signature, or another signer's statement, names
    neither). Never raises for a bad signature: the caller decides."""
    sigs = [s for s in signatures if isinstance(s, Mapping)]
    checks = check_signatures(digest, sigs, keys, name=name, version=version)
    for c in checks:
        if c.valid and (c.bound or not bound):
            return c.key_id, ""
    bad = next((c.problem for c in reversed(checks) if c.problem), None)
    if bad:
        return None, f"its {bad}"
    unbound = next((c for c in checks if c.valid), None)
    if unbound is not None:
        what = "a legacy signature" if unbound.kind == "legacy" else "an OMS statement that names no model"
        return None, (f"it carries only {what} by {unbound.key_id[:19]}..., which does not say which model and "
                      f"version it vouches for")
    if not sigs:
        return None, "it is not signed"
    return None, "it carries no signature by any of them"


def sign_digest(key_path: str | os.PathLike, digest: str) -> dict[str, str]:
    """A bare-digest signature (attestations, and legacy bundle signatures)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = load_private_key(key_path)
    return {"algorithm": ALGORITHM if isinstance(key, Ed25519PrivateKey) else ECDSA, "key_id": key_id_of(key.public_key()),
            "digest": digest, "signature": base64.b64encode(sign_bytes(key, _message(digest))).decode("ascii")}


def sign_statement_record(key_path: str | os.PathLike, *, model: str, version: int, digest: str,
                          members: Mapping[str, str], signed_at: str | None = None) -> dict[str, str]:
    """A bundle signature record (``oms-v1``): an OMS statement naming ``model@version`` whose
    canonical manifest hashes to ``digest``, ``members`` (path -> sha256 hex of the member
    file) listed beside it, signed now (``signed_at``, UTC ISO 8601) with the key at ``key_path``."""
    import json
    from datetime import datetime, timezone

    from .oms import sign_statement, statement_payload

    key = load_private_key(key_path)
    when = signed_at or datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    payload = statement_payload(model=model, version=version, digest=digest, members=members, signed_at=when)
    bundle = sign_statement(key, payload)
    return {"algorithm": OMS, "key_id": key_id_of(key.public_key()), "digest": digest,
            "signature": json.dumps(bundle, sort_keys=True, separators=(",", ":"))}


def verify_signatures(digest: str, signatures: Iterable[Mapping[str, Any]], pubkey_paths: Iterable[str], *,
                      name: str | None = None, version: int | None = None) -> str:
    """The key id of the first required key with a valid signature over ``digest`` (an OMS
    statement must name ``name``/``version`` when given; a legacy one is accepted).

    Raises SignatureError (exit 5) when no required key signed it, or a signature is forged.
    """
    keys = {key_id_of(k): k for k in (load_public_key(p) for p in pubkey_paths)}
    signer, why = valid_signer(digest, signatures, keys, name=name, version=version)
    if signer:
        return signer
    if why.startswith("its "):
        raise SignatureError(f"{digest}: {why[4:]}", hint="the bundle or its signature was tampered with, or it "
                                                           "was signed for another model or version")
    if why == "it is not signed":
        raise SignatureError(f"{digest} is not signed", hint="a signature from a required key is needed")
    raise SignatureError(f"{digest} is not signed by any required key "
                         f"({', '.join(k[:19] + '...' for k in keys)})")


def read_public_key_file(path: str | os.PathLike) -> str:
    """The PEM text of a public key file (``.pub``), checked: NotFoundError (exit 3) for a
    missing file, UsageError (exit 2) for anything but an Ed25519 or ECDSA public key."""
    data = read_key_file(path, "public key")
    public_key_from_pem(data, os.fspath(path))
    return data.decode("ascii")


def public_pem_of(key_path: str | os.PathLike) -> str:
    """The public key (SubjectPublicKeyInfo PEM text) of the private key at ``key_path``."""
    return public_pem_bytes(load_private_key(key_path).public_key()).decode("ascii")
