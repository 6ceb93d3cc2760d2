"""Content addressing: canonical JSON and sha256 over bytes and streams.

Every byte that is hashed on its way somewhere goes through one loop, :func:`pump` (over
:func:`iter_chunks`): it reads a stream in bounded pieces and hands each piece to its sinks
(a hash's ``update``, a file's ``write``) and to a progress callback. The adapters built on it:

* :func:`sha256_stream`: the digest of a stream, optionally copying it on the way;
* :class:`VerifyingReader`: a stream whose last read raises ``IntegrityError`` when the bytes
  do not hash to the expected digest (what an upload or a bundle write reads from);
* :class:`HashingWriter`: a write-through that hashes, strictly in order (what a download
  writes into).

Hashing many ranges of files at once, on every core, is ``registry.parallel``'s.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator, Sequence
from typing import IO, Any, BinaryIO

from .constants import CHUNK_SIZE
from .errors import IntegrityError

__all__ = ["canonical_json", "sha256_bytes", "sha256_stream", "digest_of_bytes", "hex_of", "all_hex64", "iter_chunks",
           "pump", "VerifyingReader", "HashingWriter"]


def canonical_json(value: Any) -> bytes:
    """Deterministic JSON: sorted keys, no insignificant whitespace, UTF-8, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest_of_bytes(data: bytes) -> str:
    """``sha256:<hex>`` of bytes."""
    return "sha256:" + sha256_bytes(data)


def all_hex64(items: Sequence[Any]) -> bool:
    """Whether every item is a ``str`` of 64 lowercase hex digits (a sha256 in hex): the chunk
    digests of a manifest or a pack index checked together, one pass in C over them all (a
    regular expression per digest takes milliseconds per 10,000).

    >>> all_hex64(["ab" * 32]), all_hex64(["AB" * 32]), all_hex64(["ab" * 31 + "a "]), all_hex64([b"ab" * 32])
    (True, False, False, False)
    """
    if not set(map(type, items)) <= {str} or not set(map(len, items)) <= {64}:
        return False
    text = "".join(items)
    try:
        decoded = bytes.fromhex(text)   # ValueError on anything but hex digits and whitespace
    except ValueError:
        return False
    return 2 * len(decoded) == len(text) and not any(c in text for c in "ABCDEF")  # no whitespace, lowercase


def hex_of(digest: str) -> str:
    """The hex part of ``sha256:<hex>`` (accepts bare hex too)."""
    return digest.split(":", 1)[1] if digest.startswith("sha256:") else digest


def iter_chunks(fp: Any, size: int | None = None, chunk: int = CHUNK_SIZE) -> Iterator[bytes]:
    """Pieces of at most ``chunk`` bytes of ``fp`` (anything with ``read(n)``): ``size`` bytes,
    or to EOF; fewer when the stream ends first (the caller compares counts)."""
    remaining = size
    while remaining is None or remaining > 0:
        want = chunk if remaining is None else min(chunk, remaining)
        data = fp.read(want)
        if not data:
            break
        if remaining is not None:
            remaining -= len(data)
        yield data


def pump(src: Any, *sinks: Callable[[bytes], object], size: int | None = None,
         progress: Callable[[int], None] | None = None) -> int:
    """Read ``src`` in bounded pieces (``size`` bytes, or to EOF), hand each piece to every sink
    in order, then report its length to ``progress``; returns the number of bytes read.

    >>> import io; h = hashlib.sha256(); out = io.BytesIO()
    >>> pump(io.BytesIO(b"abc"), h.update, out.write), out.getvalue()
    (3, b'abc')
    """
    n = 0
    for data in iter_chunks(src, size):
        for sink in sinks:
            sink(data)
        n += len(data)
        if progress is not None:
            progress(len(data))
    return n


def sha256_stream(fp: Any, size: int | None = None, *, out: IO[bytes] | None = None,
                  progress: Callable[[int], None] | None = None) -> tuple[str, int]:
    """(hex digest, byte count) of a stream (``size`` bytes of it, or to EOF), read in bounded
    pieces; with ``out``, every piece is also written there, in the same pass."""
    h = hashlib.sha256()
    n = pump(fp, h.update, *((out.write,) if out is not None else ()), size=size, progress=progress)
    return h.hexdigest(), n


class VerifyingReader:
    """Reads ``size`` bytes (or to EOF) of a stream, hashing them, and raises ``IntegrityError``
    from the read that completes the content when it does not hash to ``digest``.

    Because the check fires inside ``read``, a consumer that publishes only after reading
    everything (a local tmp file renamed at the end, an S3 multipart upload completed at the
    end, a bundle renamed into place) never publishes wrong bytes. It is deliberately not
    seekable, so consumers read each byte exactly once, in order. ``mismatch(got_hex)`` builds
    the error for wrong bytes when the caller can name them better; ``progress`` is told each
    read's length.
    """

    def __init__(self, fp: Any, digest: str, *, size: int | None = None,
                 progress: Callable[[int], None] | None = None,
                 mismatch: Callable[[str], IntegrityError] | None = None) -> None:
        self._fp = fp
        self._digest = digest
        self._size = size
        self._progress = progress
        self._mismatch = mismatch
        self._h = hashlib.sha256()
        self.count = 0
        self._done = False

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, n: int | None = -1) -> bytes:
        """Up to ``n`` bytes (all remaining when negative); short only at the end of the content."""
        if self._done:
            return b""
        want = None if n is None or n < 0 else n
        if self._size is not None:
            left = self._size - self.count
            want = left if want is None else min(want, left)
        if want is None:
            data, eof = self._fp.read(), True
        else:
            chunks, got, eof = [], 0, False
            while got < want:
                part = self._fp.read(want - got)
                if not part:
                    eof = True
                    break
                chunks.append(part)
                got += len(part)
            data = b"".join(chunks)
        self._h.update(data)
        self.count += len(data)
        if self._progress is not None and data:
            self._progress(len(data))
        if eof or (self._size is not None and self.count >= self._size):
            self._check()
        return data

    def _check(self) -> None:
        self._done = True
        if self._size is not None and self.count < self._size:
            raise IntegrityError(f"content for {self._digest} ended after {self.count} of {self._size} bytes")
        got = self._h.hexdigest()
        if "sha256:" + got != self._digest:
            if self._mismatch is not None:
                raise self._mismatch(got)
            raise IntegrityError(f"content does not match its digest {self._digest}: got sha256:{got}",
                                 hint="the source changed after it was hashed, or the digest is wrong")


class HashingWriter:
    """Writes through to a file while hashing, and reports itself unseekable so that a
    concurrent downloader (s3transfer) must deliver the bytes in order."""

    def __init__(self, fp: BinaryIO | Any) -> None:
        self._fp = fp
        self._h = hashlib.sha256()
        self.count = 0

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def write(self, data: bytes) -> int:
        self._h.update(data)
        self.count += len(data)
        return self._fp.write(data)

    def flush(self) -> None:
        self._fp.flush()

    def hexdigest(self) -> str:
        return self._h.hexdigest()
