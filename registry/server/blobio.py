"""Blob traffic: presigned URLs for S3, streaming with ``Range`` for a local store, and the
publish-time check that every blob a version names is really stored.

S3: the server only signs. An upload URL binds the object key, ``Content-Length`` and
``x-amz-checksum-sha256`` (the digest), so S3 itself refuses other bytes; a download is a 307
to a presigned GET. The access log line of a redirect names the object, never the query
string (the signature). Local store: the server streams the bytes itself and counts them.
"""
from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from typing import Any, NamedTuple

import anyio
import anyio.from_thread
from fastapi import Request
from fastapi.responses import JSONResponse, RedirectResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool

from ..blobs.base import run_parallel
from ..digests import VerifyingReader
from ..errors import NotFoundError, UsageError
from .limits import LengthRequired
from .state import ServerState

__all__ = ["BlobCheck", "blob_check", "blob_checks", "missing_blobs", "upload_plan",
           "download_urls", "serve_blob", "receive_blob", "head_blob"]

access_log = logging.getLogger("registry.server.access")
_RANGE_RE = re.compile(r"bytes=(\d*)-(\d*)\Z")
_READ = 1024 * 1024
_HEADS = 16  # HEAD requests in flight at once


def _url_without_query(url: str) -> str:
    return url.split("?", 1)[0]


class BlobCheck(NamedTuple):
    """What the store says of one blob: ``ok`` (stored, at its size, vouched for) and, on S3,
    the ``uploader`` the presigned PUT that wrote it recorded (None over a local directory)."""

    ok: bool
    uploader: str | None = None


def blob_check(state: ServerState, digest: str, size: int | None) -> BlobCheck:
    """Whether the store holds ``digest`` with ``size`` bytes (when given) and, on S3, a
    checksum that vouches for it: the full-object SHA-256 equal to the digest, or the
    composite checksum of a multipart upload (written by a direct client, which verified the
    bytes itself). An object with no checksum, or a different full-object one, is not trusted:
    the client uploads it again through a presigned PUT, which stores the verified checksum."""
    store = state.blobs
    if state.presigns:
        try:
            stored_size, checksum, uploader = store.head_info(digest)  # type: ignore[attr-defined]
        except NotFoundError as exc:
            if exc.what == "bucket":
                raise
            return BlobCheck(False)
        if (size is not None and stored_size != size) or checksum is None:
            return BlobCheck(False)
        full = checksum == store.full_object_checksum(digest)  # type: ignore[attr-defined]
        return BlobCheck(full or "-" in checksum, uploader)  # "-": composite of a multipart upload
    try:
        info = store.stat(digest)
    except NotFoundError:
        return BlobCheck(False)
    return BlobCheck(size is None or info.size == size)


def blob_checks(state: ServerState, blobs: list[tuple[str, int | None]]) -> dict[str, BlobCheck]:
    """``blob_check`` of each of ``blobs``, several at once."""
    found = run_parallel(lambda item: blob_check(state, item[0], item[1]), blobs, _HEADS) if blobs else []
    return {d: check for (d, _), check in zip(blobs, found)}


def missing_blobs(state: ServerState, blobs: list[tuple[str, int | None]]) -> list[str]:
    """The digests of ``blobs`` the store lacks (or holds unverified), in order."""
    checks = blob_checks(state, blobs)
    return [d for d, _ in blobs if not checks[d].ok]


def _base_url(state: ServerState, request: Request) -> str:
    return (state.public_url or str(request.base_url)).rstrip("/")


def upload_plan(state: ServerState, request: Request, items: list[tuple[str, int]], *,
                present: set[str], uploader: str) -> dict[str, Any]:
    """``{"missing": [{digest, size, url, method, headers}], "present": [digest]}``: ``present``
    as the caller decided (stored, and the client's to use), every other blob with where to PUT
    it; a presigned PUT records ``uploader`` on the object."""
    missing, shown = [], []
    base = _base_url(state, request)
    for digest, size in items:
        if digest in present:
            shown.append(digest)
            continue
        if state.presigns:
            url, headers = state.blobs.presign_put(  # type: ignore[attr-defined]
                digest, size, state.limits.presign_seconds, uploader=uploader)
            state.counters.add("presigned_puts", 1)
        else:
            url, headers = f"{base}/v1/blobs/{digest}", {}
        missing.append({"digest": digest, "size": size, "url": url, "method": "PUT",
                        "headers": headers})
    return {"missing": missing, "present": shown}


def _size(state: ServerState, digest: str) -> int:
    if state.presigns:
        return state.blobs.head(digest)[0]  # type: ignore[attr-defined]
    return state.blobs.stat(digest).size


def download_urls(state: ServerState, request: Request, digests: list[str]) -> dict[str, Any]:
    """``{"urls": {digest: {url, size, headers}}}`` (NotFoundError for a blob not stored)."""
    unique = list(dict.fromkeys(digests))
    sizes = run_parallel(lambda d: _size(state, d), unique, _HEADS) if unique else []
    base = _base_url(state, request)
    urls = {}
    lifetime = state.limits.presign_seconds
    for digest, size in zip(unique, sizes):
        if state.presigns:
            url = state.blobs.presign_get(digest, lifetime)  # type: ignore[attr-defined]
            state.counters.add("presigned_gets", 1)
        else:
            url = f"{base}/v1/blobs/{digest}"
        urls[digest] = {"url": url, "size": size, "headers": {}}
    if state.presigns:
        access_log.info("%s %s: %d presigned GETs for %s", request.method, request.url.path,
                        len(urls), _url_without_query(next(iter(urls.values()))["url"]) if urls else "-")
    return {"urls": urls}


def head_blob(state: ServerState, digest: str) -> Response:
    size = _size(state, digest)
    return Response(status_code=200, headers={"content-length": str(size),
                                              "accept-ranges": "bytes", "etag": f'"{digest}"'})


def serve_blob(state: ServerState, request: Request, digest: str) -> Response:
    """S3: 307 to a presigned GET. Local: the bytes, or the one ``Range`` asked for (206;
    416 when it lies outside the blob; several ranges are answered with the whole blob)."""
    if state.presigns:
        url = state.blobs.presign_get(digest, state.limits.presign_seconds)  # type: ignore[attr-defined]
        state.counters.add("presigned_gets", 1)
        access_log.info("%s %s -> 307 %s (presigned, query omitted)", request.method,
                        request.url.path, _url_without_query(url))
        return RedirectResponse(url, status_code=307)
    size = state.blobs.stat(digest).size
    start, end = 0, size - 1
    status = 200
    headers = {"accept-ranges": "bytes", "etag": f'"{digest}"',
               "content-type": "application/octet-stream"}
    wanted = request.headers.get("range")
    if wanted and "," not in wanted:
        span = _parse_range(wanted.strip(), size)
        if span is None:
            return JSONResponse(
                {"error": {"type": "UsageError", "exit_code": 2, "scope": None, "hint": None,
                           "message": f"range {wanted!r} is outside blob {digest} ({size} bytes)"}},
                status_code=416, headers={"content-range": f"bytes */{size}"})
        start, end = span
        status = 206
        headers["content-range"] = f"bytes {start}-{end}/{size}"
    headers["content-length"] = str(end - start + 1 if size else 0)
    return StreamingResponse(_file_chunks(state, digest, start, end - start + 1 if size else 0),
                             status_code=status, headers=headers)


def _parse_range(text: str, size: int) -> tuple[int, int] | None:
    """``(first, last)`` byte of a single ``bytes=`` range, None when unsatisfiable or malformed."""
    m = _RANGE_RE.match(text)
    if not m or (not m.group(1) and not m.group(2)):
        return None
    if not m.group(1):  # suffix: the last N bytes
        n = int(m.group(2))
        return (max(size - n, 0), size - 1) if n > 0 and size else None
    first = int(m.group(1))
    last = int(m.group(2)) if m.group(2) else size - 1
    if first >= size or last < first:
        return None
    return first, min(last, size - 1)


def _file_chunks(state: ServerState, digest: str, start: int, length: int) -> Iterator[bytes]:
    """The bytes, read in the thread pool (Starlette iterates a sync iterator there), counted."""
    with state.blobs.open(digest) as src:
        src.seek(start)
        left = length
        while left > 0:
            data = src.read(min(_READ, left))
            if not data:
                break
            left -= len(data)
            state.counters.add("blob_bytes_served", len(data))
            yield data


class _BodyReader(io.RawIOBase):
    """A blocking reader over the request body, for a worker thread: each read asks the event
    loop for the next chunk (so the limits middleware's deadlines and cap apply)."""

    def __init__(self, request: Request, counters: Any) -> None:
        self._chunks = request.stream().__aiter__()
        self._buffer = b""
        self._done = False
        self._counters = counters

    def readable(self) -> bool:
        return True

    async def _next(self) -> bytes | None:
        try:
            return await self._chunks.__anext__()
        except StopAsyncIteration:
            return None

    def readinto(self, out: Any) -> int:
        while not self._buffer and not self._done:
            chunk = anyio.from_thread.run(self._next)
            if chunk is None:
                self._done = True
            else:
                self._buffer = chunk
        n = min(len(out), len(self._buffer))
        out[:n] = self._buffer[:n]
        self._buffer = self._buffer[n:]
        self._counters.add("blob_bytes_received", n)
        return n


async def receive_blob(state: ServerState, request: Request, digest: str) -> dict[str, Any]:
    """PUT of one blob into a local store: ``Content-Length`` bytes, verified against the
    digest while they are written (IntegrityError, nothing stored, when they do not match).
    A blob stored already is read and verified all the same: the answer (``{"stored": true}``)
    never tells whether it was there, and an upload vouches for its sender only by its bytes."""
    if state.presigns:
        raise UsageError("this registry keeps its blobs in S3: upload through the presigned URL "
                         "POST /v1/blobs/upload answers", hint="update the client")
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise LengthRequired("a blob upload needs a Content-Length header")
    size = int(declared)
    reader = io.BufferedReader(_BodyReader(request, state.counters), buffer_size=_READ)
    await run_in_threadpool(_store_verified, state, reader, digest, size)
    return {"stored": True}


def _store_verified(state: ServerState, reader: io.BufferedReader, digest: str, size: int) -> None:
    """``put_stream`` (which verifies what it writes), or, when the blob was stored already and
    nothing was read, the body read and verified the same way (the same IntegrityError)."""
    if not state.blobs.put_stream(reader, digest, size=size):
        checked = VerifyingReader(reader, digest, size=size)
        while checked.read(_READ):
            pass
