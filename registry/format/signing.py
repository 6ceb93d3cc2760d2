"""Ed25519 signatures over bundle digests (via ``cryptography``).

The signed message is ``b"pt2-registry/bundle/v1\\n" + digest`` (domain-separated, so a key
used here cannot be tricked into signing something else). A signature record is::

    {"algorithm": "ed25519", "key_id": "sha256:<hex of the raw public key>",
     "digest": "sha256:<bundle digest>", "signature": "<base64>"}

For example::

    generate_keypair("ci")                    # writes ci.key (0600) and ci.pub
    sig = sign_digest("ci.key", "sha256:ab...")
"""
from __future__ import annotations

import base64
import hashlib
import os
import re
from pathlib import Path
from typing import Any, Iterable

from ..errors import NotFoundError, SignatureError, UsageError

__all__ = ["generate_keypair", "sign_digest", "verify_signatures", "key_id_of",
           "public_key_from_pem", "valid_signer", "read_public_key_file", "public_pem_of",
           "load_private_key"]

_DOMAIN = b"pt2-registry/bundle/v1\n"
ALGORITHM = "ed25519"


def _message(digest: str) -> bytes:
    return _DOMAIN + digest.encode("ascii")


def _raw_public(pub: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def key_id_of(pub: Any) -> str:
    return "sha256:" + hashlib.sha256(_raw_public(pub)).hexdigest()


def generate_keypair(path: str | os.PathLike) -> tuple[Path, Path]:
    """Write PATH.key (PKCS#8 PEM, mode 0600) and PATH.pub (SubjectPublicKeyInfo PEM)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    base = Path(path)
    key_path, pub_path = Path(f"{base}.key"), Path(f"{base}.pub")
    for p in (key_path, pub_path):
        if p.exists():
            raise UsageError(f"{p} already exists", hint="choose another PATH; keys are never overwritten")
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    base.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(pub)
    return key_path, pub_path


_MAX_KEY_FILE = 64 * 1024
_KEY_ID = re.compile(r"sha256:[0-9a-f]{64}\Z")


def _read_key_file(path: str | os.PathLike, what: str) -> bytes:
    """A PEM key file's bytes; a missing file is NotFoundError (exit 3), a huge one refused."""
    try:
        with open(path, "rb") as f:
            data = f.read(_MAX_KEY_FILE + 1)
    except FileNotFoundError as exc:
        raise NotFoundError(f"{what} {os.fspath(path)} not found", what="file", name=os.fspath(path)) from exc
    except IsADirectoryError as exc:
        raise UsageError(f"{what} {os.fspath(path)} is a directory, not a PEM file") from exc
    if len(data) > _MAX_KEY_FILE:
        raise UsageError(f"{what} {os.fspath(path)} is over {_MAX_KEY_FILE // 1024} KiB: not a PEM key")
    return data


def check_signature_entries(digest: str, signatures: Iterable[Any]) -> list[dict[str, str]]:
    """Refuse malformed signature entries before they are recorded (SignatureError, exit 5).

    Only the form can be checked here: whether a signature is genuine needs the signer's public
    key, which ``--require-signature KEY`` supplies at load time.
    """
    out = []
    for i, s in enumerate(signatures):
        if not isinstance(s, dict):
            raise SignatureError(f"signature #{i + 1} is not an object")
        key_id, sig = s.get("key_id"), s.get("signature")
        if s.get("algorithm") != ALGORITHM or not isinstance(key_id, str) or not _KEY_ID.match(key_id):
            raise SignatureError(f"signature #{i + 1} is not an {ALGORITHM} signature with a sha256 key id",
                                 hint="sign bundles with `pt2reg push --sign KEY` or `pt2reg sign`")
        if s.get("digest", digest) != digest:
            raise SignatureError(f"signature #{i + 1} (by {key_id[:19]}...) is for {str(s.get('digest'))[:80]}, "
                                 f"not this bundle ({digest})", hint="the signature belongs to another bundle")
        try:
            raw = base64.b64decode(str(sig), validate=True) if isinstance(sig, str) else b""
        except ValueError:
            raw = b""
        if len(raw) != 64:
            raise SignatureError(f"signature #{i + 1} (by {key_id[:19]}...) is not a 64-byte {ALGORITHM} "
                                 f"signature in base64", hint="the signature was damaged or forged")
        out.append({"algorithm": ALGORITHM, "key_id": key_id, "digest": digest, "signature": sig})
    return out


def load_private_key(path: str | os.PathLike) -> Any:
    """The Ed25519 private key in the PEM file ``path`` (unencrypted PKCS#8). Refused when the
    file is open to group or others, as ssh refuses such a key: whoever can read it can sign
    as its owner (bundles, attestations, and for a server's key its audit heads and webhook
    secrets). ``pt2reg key generate`` writes it 0600."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key_file(path, "signing key")
    if os.name == "posix":
        mode = os.stat(path).st_mode
        if mode & 0o077:
            raise UsageError(f"signing key {os.fspath(path)} is accessible by group or others (mode "
                             f"{mode & 0o777:04o}); refusing to use it", hint=f"chmod 600 {os.fspath(path)}")
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{path} is not an unencrypted PEM private key",
                         hint="create one with `pt2reg key generate PATH`") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise UsageError(f"{path} is not an Ed25519 key")
    return key


def _load_public(path: str | os.PathLike) -> Any:
    return public_key_from_pem(_read_key_file(path, "public key"), str(path))


def public_key_from_pem(data: bytes, what: str) -> Any:
    """An Ed25519 public key from PEM bytes (a `.pub` file's content, or the same text inline in
    a trust policy); UsageError (exit 2) naming ``what`` otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{what} is not a PEM public key") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise UsageError(f"{what} is not an Ed25519 public key")
    return key


def _first_valid(digest: str, signatures: Iterable[dict[str, Any]], keys: dict[str, Any]
                 ) -> tuple[str | None, str | None, bool]:
    """(key id of the first of ``keys`` with a valid signature over ``digest`` or None, the last
    problem seen with a signature by one of them ("signature by ... is invalid") or None,
    whether there were any signatures at all)."""
    from cryptography.exceptions import InvalidSignature

    sigs = [s for s in signatures if isinstance(s, dict)]
    bad = None
    for s in sigs:
        key = keys.get(str(s.get("key_id")))
        if key is None or s.get("algorithm") != ALGORITHM:
            continue
        if s.get("digest") not in (None, digest):
            bad = f"signature by {str(s['key_id'])[:19]}... is for another digest"
            continue
        try:
            key.verify(base64.b64decode(str(s.get("signature", "")), validate=True), _message(digest))
            return str(s["key_id"]), None, True
        except (InvalidSignature, ValueError):
            bad = f"signature by {str(s['key_id'])[:19]}... is invalid"
    return None, bad, bool(sigs)


def valid_signer(digest: str, signatures: Iterable[dict[str, Any]], keys: dict[str, Any]) -> tuple[str | None, str]:
    """(key id of the first of ``keys`` (key id -> public key) with a valid signature over
    ``digest``, or None with why not). Never raises for a bad signature: the caller decides."""
    signer, bad, signed = _first_valid(digest, signatures, keys)
    if signer:
        return signer, ""
    if bad:
        return None, f"its {bad}"
    if not signed:
        return None, "it is not signed"
    return None, "it carries no signature by any of them"


def sign_digest(key_path: str | os.PathLike, digest: str) -> dict[str, str]:
    key = load_private_key(key_path)
    sig = key.sign(_message(digest))
    return {"algorithm": ALGORITHM, "key_id": key_id_of(key.public_key()), "digest": digest,
            "signature": base64.b64encode(sig).decode("ascii")}


def verify_signatures(digest: str, signatures: Iterable[dict[str, Any]], pubkey_paths: Iterable[str]) -> str:
    """The key id of the first required key with a valid signature over ``digest``.

    Raises SignatureError (exit 5) when no required key signed it, or a signature is forged.
    """
    keys = {key_id_of(k): k for k in (_load_public(p) for p in pubkey_paths)}
    signer, bad, signed = _first_valid(digest, signatures, keys)
    if signer:
        return signer
    if bad:
        raise SignatureError(f"{digest}: {bad}", hint="the bundle or its signature was tampered with")
    if not signed:
        raise SignatureError(f"{digest} is not signed", hint="a signature from a required key is needed")
    raise SignatureError(f"{digest} is not signed by any required key "
                         f"({', '.join(k[:19] + '...' for k in keys)})")


def read_public_key_file(path: str | os.PathLike) -> str:
    """The PEM text of an Ed25519 public key file (``.pub``), checked: NotFoundError (exit 3)
    for a missing file, UsageError (exit 2) for anything but an Ed25519 public key."""
    data = _read_key_file(path, "public key")
    public_key_from_pem(data, os.fspath(path))
    return data.decode("ascii")


def public_pem_of(key_path: str | os.PathLike) -> str:
    """The public key (SubjectPublicKeyInfo PEM text) of the private key at ``key_path``."""
    from cryptography.hazmat.primitives import serialization

    return load_private_key(key_path).public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")
