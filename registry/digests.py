"""Content addressing: canonical JSON and streaming sha256. Pure helpers over bytes and streams."""
from __future__ import annotations

import hashlib
import json
from typing import IO, Any, Iterator

from .constants import CHUNK_SIZE

__all__ = ["canonical_json", "sha256_bytes", "sha256_stream", "digest_of_bytes", "hex_of", "iter_chunks",
           "HashingReader"]


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON: sorted keys, no insignificant whitespace, UTF-8, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of bytes."""
    return "sha256:" + sha256_bytes(data)


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>`` (accepts bare hex too)."""
    return digest.split(":", 1)[1] if digest.startswith("sha256:") else digest


def iter_chunks(fp: IO[bytes], size: int | None = None, chunk: int = CHUNK_SIZE) -> Iterator[bytes]:
    remaining = size
    while remaining is None or remaining > 0:
        want = chunk if remaining is None else min(chunk, remaining)
        data = fp.read(want)
        if not data:
            break
        if remaining is not None:
            remaining -= len(data)
        yield data


def sha256_stream(fp: IO[bytes], size: int | None = None) -> tuple[str, int]:
    """(hex digest, byte count) of a stream, read in bounded chunks."""
    h = hashlib.sha256()
    n = 0
    for data in iter_chunks(fp, size):
        h.update(data)
        n += len(data)
    return h.hexdigest(), n


class HashingReader:
    """A file-like wrapper that hashes and counts what is read through it."""

    def __init__(self, fp: IO[bytes]) -> None:
        self._fp = fp
        self._h = hashlib.sha256()
        self.count = 0

    def read(self, n: int = -1) -> bytes:
        data = self._fp.read(n)
        self._h.update(data)
        self.count += len(data)
        return data

    def hexdigest(self) -> str:
        return self._h.hexdigest()
