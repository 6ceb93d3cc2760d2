"""Signing keys: Ed25519 and ECDSA (P-256, P-384, P-521), as PEM files.

``pt2reg key generate`` writes ECDSA P-256 by default (the curve OpenSSF Model Signing's key
method verifies), ``--type ed25519`` for the kind older versions made. A key's id is ``sha256:``
of its raw public bytes (Ed25519) or of its DER SubjectPublicKeyInfo (ECDSA). What is signed
with them: ``registry.format.signing`` (bundles, attestations) and ``registry.format.oms``
(statements); ``registry.access.server_key`` (the server's audit heads).
"""
from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any

from ..errors import NotFoundError, UsageError

__all__ = ["KEY_TYPES", "generate_keypair", "key_id_of", "public_pem_bytes", "sign_bytes", "verify_bytes",
           "load_private_key", "public_key_from_pem", "load_public_key", "read_key_file", "KEY_ID_RE"]

#: ``pt2reg key generate --type``
KEY_TYPES = ("ecdsa-p256", "ecdsa-p384", "ed25519")
_CURVES = {"secp256r1": "SHA256", "secp384r1": "SHA384", "secp521r1": "SHA512"}
_MAX_KEY_FILE = 64 * 1024
KEY_ID_RE = re.compile(r"sha256:[0-9a-f]{64}\Z")


def _is_ed25519(key: Any) -> bool:
    from cryptography.hazmat.primitives.asymmetric import ed25519

    return isinstance(key, (ed25519.Ed25519PublicKey, ed25519.Ed25519PrivateKey))


def _ecdsa(key: Any) -> Any:
    """The ECDSA signature algorithm of an EC key of a supported curve."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.ECDSA(getattr(hashes, _CURVES[key.curve.name])())


def _raw_public(pub: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    if _is_ed25519(pub):
        return pub.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return pub.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)


def key_id_of(pub: Any) -> str:
    return "sha256:" + hashlib.sha256(_raw_public(pub)).hexdigest()


def public_pem_bytes(pub: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)


def sign_bytes(key: Any, message: bytes) -> bytes:
    """``message`` signed with an Ed25519 or ECDSA private key (ECDSA: a DER signature)."""
    return key.sign(message) if _is_ed25519(key) else key.sign(message, _ecdsa(key))


def verify_bytes(pub: Any, signature: bytes, message: bytes) -> bool:
    from cryptography.exceptions import InvalidSignature

    try:
        pub.verify(signature, message) if _is_ed25519(pub) else pub.verify(signature, message, _ecdsa(pub))
        return True
    except (InvalidSignature, ValueError):
        return False


def generate_keypair(path: str | os.PathLike, key_type: str = "ecdsa-p256") -> tuple[Path, Path]:
    """Write PATH.key (PKCS#8 PEM, mode 0600) and PATH.pub (SubjectPublicKeyInfo PEM) of a new
    ``key_type`` key (``KEY_TYPES``)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if key_type not in KEY_TYPES:
        raise UsageError(f"unknown key type {key_type!r}", hint=f"one of {', '.join(KEY_TYPES)}")
    base = Path(path)
    key_path, pub_path = Path(f"{base}.key"), Path(f"{base}.pub")
    for p in (key_path, pub_path):
        if p.exists():
            raise UsageError(f"{p} already exists", hint="choose another PATH; keys are never overwritten")
    if key_type == "ed25519":
        key: Any = Ed25519PrivateKey.generate()
    else:
        key = ec.generate_private_key(ec.SECP256R1() if key_type == "ecdsa-p256" else ec.SECP384R1())
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    base.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(pem)
    pub_path.write_bytes(public_pem_bytes(key.public_key()))
    return key_path, pub_path


def read_key_file(path: str | os.PathLike, what: str) -> bytes:
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


def load_private_key(path: str | os.PathLike) -> Any:
    """The Ed25519 or ECDSA private key in the PEM file ``path`` (unencrypted PKCS#8). Refused
    when the file is open to group or others, as ssh refuses such a key: whoever can read it
    can sign as its owner (bundles, attestations, and for a server's key its audit heads and
    webhook secrets). ``pt2reg key generate`` writes it 0600."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = read_key_file(path, "signing key")
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
    if not (_is_ed25519(key) or (isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.name in _CURVES)):
        raise UsageError(f"{path} is not an Ed25519 or ECDSA (P-256, P-384, P-521) key")
    return key


def load_public_key(path: str | os.PathLike) -> Any:
    return public_key_from_pem(read_key_file(path, "public key"), str(path))


def public_key_from_pem(data: bytes, what: str) -> Any:
    """An Ed25519 or ECDSA (P-256, P-384, P-521) public key from PEM bytes (a `.pub` file's
    content, or the same text inline in a trust policy); UsageError (exit 2) naming ``what``
    otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"{what} is not a PEM public key") from exc
    if not (_is_ed25519(key) or (isinstance(key, ec.EllipticCurvePublicKey) and key.curve.name in _CURVES)):
        raise UsageError(f"{what} is not an Ed25519 or ECDSA (P-256, P-384, P-521) public key")
    return key
