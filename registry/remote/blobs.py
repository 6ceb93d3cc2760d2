"""``HttpBlobStore``: the ``BlobStore`` protocol (``registry.blobs.base``) through a registry
server, with the bytes going straight to and from the URLs it hands out.

* **Push** (``put_parts``): one ``POST /v1/blobs/upload`` lists every blob with its size; the
  server answers which are missing, each with a URL (a presigned S3 PUT that S3 checks against
  its ``x-amz-checksum-sha256``, or the server's own ``/v1/blobs/{digest}`` over a local
  store) and the headers to send. Each missing range of the bundle file is then streamed to
  its URL, several at once, hashed on the way: the last bytes are sent only once the range
  matched its digest, so wrong bytes never complete an upload. A blob already stored is
  still hashed here (a damaged file must fail the push even when nothing needs sending).
* **Pull** (``get_parts``, ``get_file``): one ``POST /v1/blobs/download`` for every digest
  at once, then a GET of each URL (a presigned S3 GET, or the server's own route), streamed,
  hashed and written at its offset in the same pass; a body cut off mid-way is asked for
  again from the next byte needed (HTTP ``Range``), and an expired URL is asked for afresh.
  ``IntegrityError`` when a blob does not match its digest.

Deleting and listing blobs are gc's, which runs on the server (``pt2reg gc`` with an admin
token): those methods raise ``UsageError``.
"""
from __future__ import annotations

import functools
import hashlib
import io
import os
import threading
import time
import urllib.request
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, BinaryIO

import httpx
import urllib3

from ..blobs.base import (
    BlobInfo,
    Part,
    ProgressFn,
    PwriteWriter,
    RangeSink,
    atomic_download,
    check_range,
    check_read_range,
    locked_progress,
    open_range,
    range_error,
    run_parallel,
    short_blob_error,
    unique_parts,
    verified_into,
)
from ..blobs.remote import NetworkBlobs
from ..constants import VERSION
from ..digests import sha256_bytes
from ..errors import IntegrityError, NotFoundError, StoreError, UsageError, brief
from ..parallel import run_calls
from ..refs import validate_digest
from .http import ATTEMPTS, BACKOFF, TIMEOUT, HttpClient, same_origin, without_query
from .meta import SERVER_SIDE_HINT

__all__ = ["HttpBlobStore", "Target", "TRANSFERS", "READ_SIZE", "STREAM_ATTEMPTS"]

#: blobs moved at once (each its own connection from the client's pool)
TRANSFERS = 8
#: bytes read from the file at a time while uploading (a download writes what arrives)
READ_SIZE = 512 * 1024
#: tries per blob download: a body cut off is resumed from the next byte, this many times in all
STREAM_ATTEMPTS = 5
#: how long the server's answer of where to read a blob is reused for more ranged reads of it
#: (the server presigns bucket URLs for much longer)
RANGE_TARGET_SECONDS = 60.0
#: bytes handed on at a time from a streamed body: httpx delivers ~64 KiB pieces, and hashing,
#: writing and counting each one on its own made a pull through presigned URLs slower than a
#: direct S3 pull; batching them (``_batched``) costs a copy per MiB
STREAM_PIECE = 1 << 20
_CUT_OFF = (httpx.ReadError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteError,
            httpx.WriteTimeout, httpx.ConnectError, httpx.ConnectTimeout,
            urllib3.exceptions.HTTPError)  # a presigned GET's body: ProtocolError, ReadTimeoutError, SSLError
#: a presigned GET (read with urllib3: httpx/h11 parse each 64 KiB read in Python, which cost a
#: pull through the server 70% more client CPU than a direct S3 pull): a connection refused or
#: broken before the answer, or a 503, is tried again with backoff, as ``HttpClient`` does;
#: redirects are followed (the bucket never gets the token, so none can leak on)
_BUCKET_RETRIES = urllib3.Retry(total=None, connect=ATTEMPTS - 1, read=ATTEMPTS - 1, status=ATTEMPTS - 1, other=0,
                                redirect=4, status_forcelist=(503,), backoff_factor=BACKOFF, raise_on_status=False)


@dataclass(frozen=True)
class Target:
    """Where one blob is sent to or fetched from: ``url`` with ``headers`` (those a presigned
    URL was signed with), and its size."""

    digest: str
    url: str
    size: int
    method: str = "GET"
    headers: dict[str, str] = field(default_factory=dict)


class _Cancelled(Exception):
    """Another blob of the batch failed: this one stops (that failure is what is reported)."""


class HttpBlobStore(NetworkBlobs):
    """A registry server's blobs, through ``client`` (shared with ``HttpMetadataStore``)."""

    #: beyond ``NetworkBlobs``: the server presigns, not this client
    presigns = False

    def __init__(self, client: HttpClient, *, transfers: int = TRANSFERS) -> None:
        self.client = client
        self.url = client.base_url
        self._transfers = max(1, transfers)
        # presigned GETs go through urllib3, with httpx's certificates; behind a proxy
        # (HTTPS_PROXY & co., which httpx honours) they stay on httpx
        self._bucket = None if urllib.request.getproxies() else urllib3.PoolManager(
            maxsize=self._transfers, block=False, retries=_BUCKET_RETRIES, ssl_context=httpx.create_ssl_context(),
            timeout=urllib3.Timeout(connect=TIMEOUT.connect, read=TIMEOUT.read))
        # ranged reads of one pack (a pull reads each in runs of a few MiB) share its target
        self._range_targets: dict[str, tuple[Target, float]] = {}
        self._range_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"HttpBlobStore({self.url!r})"

    # -- writing ----------------------------------------------------------------------------
    def put_parts(self, path: str | os.PathLike, parts: Sequence[Part], *,
                  progress: ProgressFn | None = None, unrecorded: Collection[str] = ()) -> tuple[int, int]:
        """Upload the ranges of ``path`` the server lacks, several at once, each hashed as it
        is sent; returns (bytes uploaded, bytes already stored). ``unrecorded`` is not used:
        the server says what it lacks in the same request that authorizes the upload."""
        progress = locked_progress(progress)
        todo, repeated = unique_parts(parts)
        with open_range(path, 0, None) as (src, file_size):
            for part in todo:
                if part.offset < 0 or part.offset + part.size > file_size:
                    raise UsageError(f"{os.fspath(path)} has {file_size} bytes; cannot read {part.size} bytes "
                                     f"at offset {part.offset}")
            if progress is not None and repeated:
                progress(repeated)
            missing = self._upload_targets(todo)
            fd, stop = src.fileno(), threading.Event()

            def one(part: Part) -> tuple[int, int]:
                if stop.is_set():
                    raise _Cancelled()
                target = missing.get(part.digest)
                if target is None:
                    check_range(path, part, fd=fd, progress=progress)
                    return 0, part.size
                self._put_range(path, fd, part, target, progress, stop)
                return part.size, 0

            # the first failure is the one raised (the others stop with _Cancelled after it)
            done = run_parallel(one, todo, self._transfers, on_error=stop.set)
        return sum(u for u, _ in done), sum(s for _, s in done) + repeated

    def put_file(self, path: str | os.PathLike, digest: str, *, offset: int = 0,
                 length: int | None = None, progress: ProgressFn | None = None) -> bool:
        """Upload bytes ``[offset, offset+length)`` of ``path`` unless the server has them
        (then they are still hashed: ``IntegrityError`` when they do not match)."""
        with open_range(path, offset, length) as (src, length):
            part = Part(digest, offset, length)
            target = self._upload_targets([part]).get(digest)
            if target is None:
                check_range(path, part, fd=src.fileno(), progress=progress)
                return False
            self._put_range(path, src.fileno(), part, target, locked_progress(progress), threading.Event())
        return True

    def put_stream(self, fp: BinaryIO, digest: str, *, size: int | None = None,
                   progress: ProgressFn | None = None) -> bool:
        """Upload ``size`` bytes of ``fp`` (or all of it) unless the server has them."""
        data = fp.read() if size is None else fp.read(size)
        if size is not None and len(data) != size:
            raise IntegrityError(f"blob {digest}: the stream ended after {len(data)} of {size} bytes")
        stored = self.put_bytes(data, digest)
        if progress is not None:
            progress(len(data))
        return stored

    def put_bytes(self, data: bytes, digest: str) -> bool:
        """Upload ``data`` (checked against ``digest`` first) unless the server has it."""
        validate_digest(digest)
        got = sha256_bytes(data)
        if "sha256:" + got != digest:
            raise IntegrityError(f"bytes for blob {digest} hash to sha256:{got}", hint="this is a bug: please report it")
        target = self._upload_targets([Part(digest, 0, len(data))]).get(digest)
        if target is None:
            return False
        self._send(target, lambda: data)
        return True

    def _upload_targets(self, parts: Sequence[Part]) -> dict[str, Target]:
        """Ask the server which blobs it lacks: ``{digest: where to PUT it}``."""
        if not parts:
            return {}
        for part in parts:
            validate_digest(part.digest)
        answer = self.client.post_json("/v1/blobs/upload", {
            "blobs": [{"digest": p.digest, "size": p.size} for p in parts]}, idempotent=True)
        sizes = {p.digest: p.size for p in parts}
        try:
            missing = {t.digest: t for t in (_target(raw, "PUT") for raw in answer["missing"])}
            present = {str(d) for d in answer["present"]}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _malformed("/v1/blobs/upload") from exc
        if set(missing) | present != set(sizes) or any(missing[d].size != sizes[d] for d in missing):
            raise _malformed("/v1/blobs/upload")
        return missing

    def _put_range(self, path: str | os.PathLike, fd: int, part: Part, target: Target,
                   progress: ProgressFn | None, stop: threading.Event) -> None:
        """Send ``part``'s bytes of ``fd`` to ``target``, hashed as they go: the last piece
        leaves only once the whole range matched the digest (``IntegrityError`` otherwise)."""
        sent = [0]

        def body() -> Iterator[bytes]:
            if sent[0] and progress is not None:
                progress(-sent[0])  # a retry sends the range again from its start
            sent[0] = 0
            h, pos, left = hashlib.sha256(), part.offset, part.size
            while left > 0:
                if stop.is_set():
                    raise _Cancelled()
                data = os.pread(fd, min(READ_SIZE, left), pos)
                if not data:
                    raise OSError(f"{os.fspath(path)} ended {left} bytes early (at byte {pos})")
                h.update(data)
                pos += len(data)
                left -= len(data)
                if not left and h.hexdigest() != part.digest[7:]:
                    raise range_error(path, part, h.hexdigest())
                yield data
                sent[0] += len(data)
                if progress is not None:
                    progress(len(data))
            if not part.size and h.hexdigest() != part.digest[7:]:
                raise range_error(path, part, h.hexdigest())

        self._send(target, body)

    def _send(self, target: Target, content: Callable[[], Any]) -> None:
        headers = {**target.headers, "Content-Length": str(target.size)}
        response = self.client.send(target.method, target.url, content=content(), headers=headers,
                                    idempotent=True, rewind=content)
        response.close()

    # -- reading ----------------------------------------------------------------------------
    def exists(self, digest: str) -> bool:
        """True when the server stores the blob (one HEAD request)."""
        return self._head(digest) is not None

    def stat(self, digest: str) -> BlobInfo:
        """Size (and, when the server says, mtime) of a stored blob; ``NotFoundError`` if missing."""
        info = self._head(digest)
        if info is None:
            raise NotFoundError(f"blob {digest} not found in the registry at {self.url}", what="blob", name=digest)
        return info

    def _head(self, digest: str) -> BlobInfo | None:
        validate_digest(digest)
        response = self.client.send("HEAD", f"/v1/blobs/{digest}", ok=(404,))
        response.close()
        if response.status_code == 404:
            return None
        try:
            size = int(response.headers["content-length"])
        except (KeyError, ValueError) as exc:
            raise _malformed(f"HEAD /v1/blobs/{digest}") from exc
        mtime = 0.0
        if "last-modified" in response.headers:
            from email.utils import parsedate_to_datetime

            try:
                mtime = parsedate_to_datetime(response.headers["last-modified"]).timestamp()
            except (TypeError, ValueError):
                pass
        return BlobInfo(digest=digest, size=size, mtime=mtime)

    def download_targets(self, digests: Iterable[str]) -> dict[str, Target]:
        """Where to GET each blob (one request for all of them); ``NotFoundError`` /
        ``AccessDeniedError`` as the server says."""
        wanted = sorted({validate_digest(d) for d in digests})
        if not wanted:
            return {}
        answer = self.client.post_json("/v1/blobs/download", {"digests": wanted}, idempotent=True)
        try:
            urls = answer["urls"]
            targets = {d: _target({**urls[d], "digest": d}, "GET") for d in wanted}
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise _malformed("/v1/blobs/download") from exc
        return targets

    def get_parts(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                  on_done: Callable[[int], None] | None = None) -> None:
        """Download blobs into ranges of the open file ``fd``, several at once, each hashed
        while it streams and verified before ``on_done(i)``."""
        stop = threading.Event()
        run_calls(self._fetches(fd, parts, progress, on_done, stop), self._transfers, on_error=stop.set)

    def part_fetches(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                     on_done: Callable[[int], None] | None = None) -> list[Callable[[], None]]:
        """``get_parts``' calls, one per part (the server asked where they all are, once, here)."""
        return self._fetches(fd, parts, progress, on_done, threading.Event())

    def _fetches(self, fd: int, parts: Sequence[Part], progress: ProgressFn | None,
                 on_done: Callable[[int], None] | None, stop: threading.Event) -> list[Callable[[], None]]:
        progress = locked_progress(progress)
        targets = self.download_targets(p.digest for p in parts)

        def one(i: int) -> None:
            part = parts[i]
            target = targets[part.digest]
            if target.size != part.size:
                raise IntegrityError(f"blob {part.digest} has {target.size} bytes, expected {part.size}",
                                     hint="the version's manifest does not match the store")
            sink = PwriteWriter(fd, part.offset, part.size, part.digest)
            with verified_into(sink, part.digest, f"the registry at {self.url}") as writer:
                self._fetch(target, writer, progress, stop)
            if on_done is not None:
                on_done(i)

        return [functools.partial(one, i) for i in range(len(parts))]

    def get_file(self, digest: str, dest: str | os.PathLike, *, progress: ProgressFn | None = None) -> None:
        """Download to ``dest`` atomically, verifying the digest on the way."""
        target = self.download_targets([digest])[digest]
        with atomic_download(dest, digest, f"the registry at {self.url}") as writer:
            self._fetch(target, writer, progress, threading.Event())

    def read_bytes(self, digest: str, *, max_size: int) -> bytes:
        """The verified content; ``IntegrityError`` when it is larger than ``max_size``."""
        target = self.download_targets([digest])[digest]
        if target.size > max_size:
            raise IntegrityError(f"blob {digest} is larger than the limit of {max_size} bytes")
        out = io.BytesIO()
        with verified_into(out, digest, f"the registry at {self.url}") as writer:
            self._fetch(target, writer, None, threading.Event())
        return out.getvalue()

    def open(self, digest: str) -> BinaryIO:
        """A raw, unverified read stream of the blob (the caller verifies); close it when done."""
        target = self.download_targets([digest])[digest]
        response = self.client.send("GET", target.url, headers={**target.headers, "Accept-Encoding": "identity"},
                                    stream=True)
        return _ResponseReader(response)

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of the blob, raw and unverified: one GET with
        ``Range`` (a presigned S3 URL, or the server's own route over a local store, which
        answers 206), resumed and retried as ``_fetch`` does. ``NotFoundError`` if the server
        does not store it; ``IntegrityError`` when it is shorter than ``offset + length`` or the
        answer is not the range asked for."""
        out = io.BytesIO()
        self.read_range_into(digest, offset, length, out)
        return out.getvalue()

    def read_range_into(self, digest: str, offset: int, length: int, out: RangeSink) -> None:
        """``read_range``'s bytes into ``out`` in order, as they arrive (``STREAM_PIECE`` at a time)."""
        check_read_range(digest, offset, length)
        target = self._range_target(digest)
        if offset + length > target.size:
            raise short_blob_error(digest, offset, length, f"the registry at {self.url}", target.size)
        self._fetch(target, out, None, threading.Event(), offset=offset, length=length)

    def _range_target(self, digest: str) -> Target:
        """The download target of a blob read in ranges, asked of the server once per
        ``RANGE_TARGET_SECONDS`` (a pull reads a pack in a dozen runs; a target a bucket
        refuses meanwhile, expired, is asked for again by ``_fetch``)."""
        now = time.monotonic()
        with self._range_lock:
            known = self._range_targets.get(digest)
            if known is not None and now - known[1] < RANGE_TARGET_SECONDS:
                return known[0]
        target = self.download_targets([digest])[digest]
        with self._range_lock:
            if len(self._range_targets) >= 1024:
                self._range_targets.clear()
            self._range_targets[digest] = (target, now)
        return target

    def _fetch(self, target: Target, writer: Any, progress: ProgressFn | None, stop: threading.Event, *,
               offset: int = 0, length: int | None = None) -> None:
        """``target.size`` bytes into ``writer``, in order (with ``length``: bytes ``[offset,
        offset+length)`` of the blob, every GET ranged; an answer of 416 or cut at the blob's
        end is a ``short_blob_error``). A body cut off is asked for again from the next byte
        (``Range``), up to ``STREAM_ATTEMPTS`` tries in all; a presigned URL the bucket refuses
        (expired) is asked of the server afresh, once per try."""
        got, failures, writing = 0, 0, False
        size = target.size if length is None else length
        ranged = length is not None
        while True:
            headers = {**target.headers, "Accept-Encoding": "identity"}
            if got or ranged:
                headers["Range"] = f"bytes={offset + got}-{offset + size - 1}"
            external = not same_origin(target.url, self.url)
            unsatisfiable = (416,) if ranged else ()
            try:
                if external and self._bucket is not None:
                    response: Any = self._get_presigned(target.url, headers, ok=(403, *unsatisfiable))
                else:
                    response = self.client.send("GET", target.url, headers=headers, stream=True,
                                                ok=((403,) if external else ()) + unsatisfiable)
            except StoreError:
                failures += 1
                if failures >= STREAM_ATTEMPTS:
                    raise
                continue
            try:
                if response.status_code == 403:  # the bucket refused the URL: it expired
                    failures += 1
                    if failures >= STREAM_ATTEMPTS:
                        raise StoreError(f"the blob store refused the download of {target.digest} (HTTP 403)",
                                         hint="check the server's S3 credentials and clock")
                    target = self.download_targets([target.digest])[target.digest]
                    continue
                if response.status_code == 416:  # the range starts at or past the blob's end
                    total = response.headers.get("content-range", "").rpartition("/")[2]
                    raise short_blob_error(target.digest, offset, size, f"the registry at {self.url}",
                                           int(total) if total.isdigit() else None)
                _check_range_answer(target, got, response, offset=offset, length=length,
                                    where=f"the registry at {self.url}")
                for data in response.pieces() if isinstance(response, _Presigned) else \
                        _batched(response.iter_bytes(), STREAM_PIECE):
                    if stop.is_set():
                        raise _Cancelled()
                    if got + len(data) > size:
                        if ranged:
                            raise IntegrityError(f"blob {target.digest}: the store sent more than the {size} "
                                                 f"bytes asked for at offset {offset}",
                                                 hint="the store does not honour ranged GETs")
                        raise IntegrityError(f"blob {target.digest} is larger than the {size} bytes expected",
                                             hint="the store holds the wrong content for it")
                    writing = True    # what the writer raises is its own, never a cut-off body
                    writer.write(data)
                    writing = False
                    got += len(data)
                    if progress is not None:
                        progress(len(data))
                if got == size:
                    return
                failures += 1  # the body ended early without an error: ask for the rest
                if failures >= STREAM_ATTEMPTS:
                    raise StoreError(f"the download of blob {target.digest} stopped at byte {got} of {size}",
                                     hint="try again")
            except _CUT_OFF as exc:
                if writing:
                    raise
                if got == size:
                    return  # every byte arrived before the connection failed: the digest decides
                failures += 1
                if failures >= STREAM_ATTEMPTS:
                    raise StoreError(f"the download of blob {target.digest} failed at byte {got} of {size} "
                                     f"after {failures} tries: {type(exc).__name__}", hint="try again") from exc
            finally:
                response.close()

    def _get_presigned(self, url: str, headers: dict[str, str], ok: tuple[int, ...] = (403,)) -> _Presigned:
        """GET a presigned URL with urllib3, never with an ``Authorization`` header; an error
        answer not in ``ok`` (403 and, for a ranged read, 416 are left to ``_fetch``) is a
        ``StoreError``, as ``HttpClient.send``'s."""
        assert self._bucket is not None
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        try:
            answer = self._bucket.request("GET", url, headers={"User-Agent": f"pt2reg/{VERSION}", **headers},
                                          preload_content=False, decode_content=False)
        except urllib3.exceptions.HTTPError as exc:  # retries spent (the reason names no query)
            reason = getattr(exc, "reason", None) or exc
            raise StoreError(f"a blob transfer to {without_query(url)} failed: {brief(reason)}",
                             hint="try again; the registry hands out a fresh URL each time") from exc
        if answer.status >= 400 and answer.status not in ok:
            answer.close()
            answer.release_conn()
            raise StoreError(f"the blob store refused GET {without_query(url)} (HTTP {answer.status})",
                             hint="the presigned URL may have expired: try again")
        return _Presigned(answer)

    # -- gc's, on the server ----------------------------------------------------------------
    def delete(self, digest: str) -> None:
        raise UsageError("a remote client cannot delete blobs", hint=SERVER_SIDE_HINT)

    def list(self) -> Iterator[BlobInfo]:
        raise UsageError("a remote client cannot list blobs", hint=SERVER_SIDE_HINT)

    def abort_stale_uploads(self, older_than_seconds: float = 0.0, *,
                            keep: Iterable[str] | Callable[[], Iterable[str]] = (),
                            dry_run: bool = False) -> list[str]:
        raise UsageError("a remote client cannot abort uploads", hint=SERVER_SIDE_HINT)


def _batched(chunks: Iterator[bytes], size: int) -> Iterator[bytes]:
    """``chunks`` joined into pieces of at least ``size`` bytes (the last may be shorter). When
    the stream breaks, the bytes already received are handed on before the error, so a resumed
    download asks for exactly the next byte."""
    buf = bytearray()
    try:
        for data in chunks:
            buf += data
            if len(buf) >= size:
                yield bytes(buf)
                buf = bytearray()
    except Exception:
        if buf:
            yield bytes(buf)
        raise
    if buf:
        yield bytes(buf)


class _Presigned:
    """A urllib3 answer to a presigned GET, as ``_fetch`` reads an httpx one: ``status_code``,
    ``headers``, ``pieces()`` (reads of up to ``STREAM_PIECE`` bytes) and ``close()``."""

    def __init__(self, answer: urllib3.BaseHTTPResponse) -> None:
        self._answer = answer
        self.status_code = answer.status
        self.headers = answer.headers

    def pieces(self) -> Iterator[bytes]:
        return self._answer.stream(STREAM_PIECE, decode_content=False)

    def close(self) -> None:
        """A body read to its end has already gone back to the pool; one cut short closes
        its connection (the pool opens a new one)."""
        self._answer.close()
        self._answer.release_conn()


def _target(raw: Any, method: str) -> Target:
    headers = raw.get("headers") or {}
    if not isinstance(raw["url"], str) or not isinstance(headers, dict):
        raise ValueError("url or headers")
    size = raw["size"]
    if isinstance(size, bool) or not isinstance(size, int) or size < 0:
        raise ValueError("size")
    return Target(digest=validate_digest(str(raw["digest"])), url=raw["url"], size=size,
                  method=str(raw.get("method") or method).upper(),
                  headers={str(k): str(v) for k, v in headers.items()})


def _check_range_answer(target: Target, start: int, response: httpx.Response | _Presigned, *,
                        offset: int = 0, length: int | None = None, where: str = "the registry") -> None:
    """The answer is the whole blob (from byte 0) or exactly ``bytes start-(size-1)/size``;
    for a ranged read (``length``), exactly ``bytes (offset+start)-(offset+length-1)/size``
    (one cut at a blob shorter than ``offset + length`` is a ``short_blob_error``)."""
    if not start and length is None:
        if response.status_code == 206:
            raise IntegrityError(f"blob {target.digest}: the store answered a part where the whole blob was asked for")
        return
    first = offset + start
    last = target.size - 1 if length is None else offset + length - 1
    expected = f"bytes {first}-{last}/{target.size}"
    got = response.headers.get("content-range", "")
    if response.status_code == 206 and length is not None and got != expected:
        total = got.rpartition("/")[2]
        if total.isdigit() and int(total) < offset + length:
            raise short_blob_error(target.digest, offset, length, where, int(total))
    if response.status_code != 206 or got != expected:
        raise IntegrityError(f"blob {target.digest}: asked for bytes {first}-{last}, "
                             f"the store answered {got or 'the whole blob'}",
                             hint="the store does not honour ranged GETs")


def _malformed(where: str) -> StoreError:
    return StoreError(f"the registry server sent a malformed answer to {where}",
                      hint="the client and the server may be different versions of pt2reg")


class _ResponseReader(io.RawIOBase):
    """A streamed response as a binary file (``read``/``readinto``); closing it closes the response."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self._chunks = response.iter_bytes(STREAM_PIECE)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        n = min(len(b), len(self._buffer))
        b[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._response.close()
        super().close()
