"""The registry server's key (Ed25519 or ECDSA): it signs audit chain heads, and (through a derived key)
encrypts the webhook secrets kept in the database.

The key file is ``pt2reg serve --signing-key FILE``, else ``$PT2REG_SIGNING_KEY``, else
``HOME/server-signing.key`` (created on first start, mode 0600, with its ``.pub`` beside it).
Every replica of one registry must use the same key file. Pure functions over keys and values;
the only file access is :func:`load_or_create`.

    >>> message = head_message(7, "ab" * 32, "2026-11-24T09:00:00.000000Z", "sha256:" + "0" * 64)
    >>> message.startswith(HEAD_DOMAIN)
    True
"""
from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from ..digests import canonical_json
from ..errors import UsageError
from ..format.signing import (
    generate_keypair,
    key_id_of,
    load_private_key,
    public_key_from_pem,
    sign_bytes,
    verify_bytes,
)

__all__ = ["secret_sealer", "ENV_SIGNING_KEY", "DEFAULT_KEY_FILE", "HEAD_DOMAIN", "key_path", "load_or_create",
           "public_pem", "server_key_id", "head_message", "sign_head", "check_heads",
           "secrets_key", "encrypt_secret", "decrypt_secret", "parse_webhook_secret"]

ENV_SIGNING_KEY = "PT2REG_SIGNING_KEY"
DEFAULT_KEY_FILE = "server-signing.key"
HEAD_DOMAIN = b"pt2-registry/audit-head/v1\n"
_SECRETS_INFO = b"pt2-registry/webhook-secrets/v1"
_SECRET_PREFIX = "whsec_"


def key_path(home: Path, explicit: str | os.PathLike | None = None) -> tuple[Path, bool]:
    """``(path, may_create)``: the key file to use; only the default under home is created."""
    chosen = explicit or os.environ.get(ENV_SIGNING_KEY) or None
    if chosen:
        return Path(chosen), False
    return Path(home) / DEFAULT_KEY_FILE, True


def load_or_create(path: Path, may_create: bool) -> Any:
    """The private key at ``path`` (Ed25519 or ECDSA); generated (0600, ECDSA P-256) when
    ``may_create`` and absent."""
    if not path.exists():
        if not may_create:
            raise UsageError(f"signing key {path} does not exist",
                             hint="create one with `pt2reg key generate PATH` (use PATH.key)")
        base = path.with_suffix("") if path.suffix == ".key" else path
        generate_keypair(base)
        path = Path(f"{base}.key")
    return load_private_key(path)  # refused when group or others can read it


def public_pem(key: Any) -> str:
    from cryptography.hazmat.primitives import serialization

    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo).decode("ascii")


def server_key_id(key: Any) -> str:
    return key_id_of(key.public_key())


def head_message(seq: int, hash_: str, signed_at: str, key_id: str) -> bytes:
    """The bytes a head signature covers: a domain line, then canonical JSON."""
    return HEAD_DOMAIN + canonical_json({"seq": int(seq), "hash": hash_, "signed_at": signed_at,
                                         "key_id": key_id})


def sign_head(key: Any, seq: int, hash_: str, signed_at: str) -> dict[str, Any]:
    """A signed head ``{seq, hash, signed_at, key_id, signature}`` (signature: base64)."""
    kid = server_key_id(key)
    sig = sign_bytes(key, head_message(seq, hash_, signed_at, kid))
    return {"seq": int(seq), "hash": hash_, "signed_at": signed_at, "key_id": kid,
            "signature": base64.b64encode(sig).decode("ascii")}


def _signature_ok(pub: Any, head: Any, signed_at: str) -> bool:
    try:
        sig = base64.b64decode(head.signature, validate=True)
    except (binascii.Error, ValueError, TypeError):
        return False
    return verify_bytes(pub, sig, head_message(head.seq, head.hash, signed_at, head.key_id))


def check_heads(heads: Iterable[Any], found: dict[int, str], pub_pem: bytes, *,
                ts_text: Any = str) -> tuple[int | None, str] | None:
    """None when every signed head verifies under ``pub_pem`` and the chain (``found``: seq ->
    hash as stored now) still carries each signed hash; else ``(first_bad_seq, reason)``.

    ``heads``: records with ``seq, hash, signed_at, key_id, signature``; ``ts_text`` turns
    ``signed_at`` into the text that was signed. A head by any other key is refused. A hash that
    differs means the chain was rewritten after the newest head that still matches: the first
    bad event is the one after it (exact when the server signed a head per change).
    """
    pub = public_key_from_pem(pub_pem, "server key")
    kid = key_id_of(pub)
    ordered = sorted(heads, key=lambda h: h.seq)
    if not ordered:
        return None, (f"no audit head signed by the server key {kid[:19]}... is stored: the "
                      f"server never signed this log, or its signed heads were deleted")
    for h in ordered:
        if h.key_id != kid or not _signature_ok(pub, h, ts_text(h.signed_at)):
            return h.seq, (f"the signed head for event {h.seq} does not verify under the server "
                           f"key {kid[:19]}... (it claims key {str(h.key_id)[:19]}...): refused")
    last_good = 0
    for h in ordered:
        got = found.get(h.seq)
        if got is None:
            return last_good + 1, (
                f"event {h.seq} is gone, though the server signed it at {ts_text(h.signed_at)}: "
                f"the log was truncated or rewritten from event {last_good + 1} on (event "
                f"{last_good} is the newest that still matches a signed head)")
        if got != h.hash:
            return last_good + 1, (
                f"event {h.seq} no longer has the hash the server signed at {ts_text(h.signed_at)}: "
                f"the chain was recomputed from event {last_good + 1} on (event {last_good} is the "
                f"newest that still matches a signed head)")
        last_good = h.seq
    return None


def secrets_key(key: Any) -> bytes:
    """The AES-256 key that encrypts webhook secrets: HKDF-SHA256 of the signing key's private
    bytes with its own label (so the signing key itself is never used to encrypt)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if isinstance(key, ec.EllipticCurvePrivateKey):  # the private scalar, big-endian, at the curve's width
        raw = key.private_numbers().private_value.to_bytes((key.curve.key_size + 7) // 8, "big")
    else:  # Ed25519: its 32 raw private bytes (how secrets were always keyed)
        raw = key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw,
                                serialization.NoEncryption())
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_SECRETS_INFO).derive(raw)


def encrypt_secret(kek: bytes, secret: bytes, webhook_url: str) -> str:
    """``v1:`` + base64(nonce + AES-GCM ciphertext); the URL is bound as associated data, so a
    ciphertext copied onto another webhook row does not decrypt."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    nonce = os.urandom(12)
    sealed = AESGCM(kek).encrypt(nonce, secret, webhook_url.encode("utf-8"))
    return "v1:" + base64.b64encode(nonce + sealed).decode("ascii")


def decrypt_secret(kek: bytes, text: str, webhook_url: str) -> bytes:
    """Inverse of :func:`encrypt_secret`; ValueError when it does not decrypt (another key)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    if not text.startswith("v1:"):
        raise ValueError("unknown secret format")
    try:
        blob = base64.b64decode(text[3:], validate=True)
        return AESGCM(kek).decrypt(blob[:12], blob[12:], webhook_url.encode("utf-8"))
    except (InvalidTag, binascii.Error) as exc:
        raise ValueError("the secret does not decrypt under this server's key") from exc


def parse_webhook_secret(text: str) -> bytes:
    """The key bytes of a Standard Webhooks secret ``whsec_<base64 of 24..64 bytes>``.

    >>> len(parse_webhook_secret("whsec_" + "A" * 32))
    24
    """
    text = text.strip()
    if not text.startswith(_SECRET_PREFIX):
        raise UsageError("a webhook secret must look like whsec_<base64>",
                         hint="make one: python -c \"import base64,os;"
                              "print('whsec_'+base64.b64encode(os.urandom(32)).decode())\"")
    try:
        raw = base64.b64decode(text[len(_SECRET_PREFIX):], validate=True)
    except binascii.Error as exc:
        raise UsageError("the webhook secret after whsec_ is not valid base64") from exc
    if not 24 <= len(raw) <= 64:
        raise UsageError(f"a webhook secret must be 24 to 64 bytes (this one is {len(raw)})")
    return raw


def secret_sealer(kek: bytes, key_id: str) -> Callable[[str, str], tuple[str, str]]:
    """``(url, secret text) -> (sealed secret, key_id)``: a ``whsec_...`` secret checked
    (``parse_webhook_secret``) and encrypted for ``url`` under ``kek`` (a SQL store's
    ``secret_sealer``, set by whoever holds the server key)."""
    def seal(url: str, text: str) -> tuple[str, str]:
        return encrypt_secret(kek, parse_webhook_secret(text), url), key_id
    return seal
