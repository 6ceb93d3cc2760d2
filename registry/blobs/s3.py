"""The S3 blob store (``s3://bucket/prefix``): AWS or any S3-compatible server.

The endpoint and credentials come from the standard AWS configuration (``AWS_ENDPOINT_URL``,
``AWS_ACCESS_KEY_ID``, ``~/.aws/config`` ...), which boto3 reads natively. Blobs live at
``<prefix>/blobs/sha256/ab/abcdef...``; the store never writes anything else. For example::

    store = S3BlobStore("s3://models/team-a")
    store.get_file("sha256:" + "ab" * 32, "/tmp/model.pt2")   # verified, atomic

Transfers go through s3transfer (the engine behind boto3's ``upload_fileobj``), fed with
unseekable adapters so every byte passes our hash exactly once and in order:

* uploads read through ``VerifyingReader``: a mismatch raises inside the read of the last
  part, before s3transfer sends ``CompleteMultipartUpload`` (or, below the multipart threshold,
  before the single ``PutObject``), and s3transfer then aborts the multipart upload. So wrong
  bytes never become visible.
* downloads write through ``HashingWriter``; s3transfer fetches parts concurrently but, for an
  unseekable target, hands them to one IO thread in order (a sliding window of at most
  ``max_concurrency + 2`` buffered parts), so hashing happens in the same pass as writing
  instead of re-reading the finished file.
* ``put_parts`` (a bundle's chunks) runs up to ``max_concurrency`` blobs at once through one
  ``TransferManager``, so its memory windows bound the whole batch and the connection pool
  never drains between blobs; the first failure cancels the other transfers.
* ``get_parts`` streams each blob up to the multipart threshold (every chunk of a bundle) with
  one ranged GET on its own worker, hashed and written at its offset in the same thread: the
  blobs hash on every core at once (s3transfer's single IO thread would hash them one after
  the other), memory is one 512 KiB read per worker, and a body cut off mid-way is asked for
  again from the next byte (the bytes of one blob still pass the hash once, in order). A
  larger blob takes the s3transfer path above.
"""
from __future__ import annotations

import contextlib
import functools
import io
import os
import re
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from concurrent.futures import CancelledError
from typing import BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError, NoCredentialsError
from s3transfer.exceptions import RetriesExceededError
from s3transfer.manager import TransferConfig, TransferManager
from s3transfer.subscribers import BaseSubscriber
from s3transfer.utils import S3_RETRYABLE_DOWNLOAD_ERRORS

from ..constants import s3_multipart_threshold
from ..digests import VerifyingReader, sha256_bytes, sha256_stream
from ..errors import IntegrityError, NotFoundError, RegistryError, StoreError, UsageError
from ..parallel import run_calls
from .base import (
    BLOBS_DIR,
    BlobInfo,
    Part,
    ProgressFn,
    PwriteWriter,
    RangeSink,
    atomic_download,
    blob_relpath,
    check_range,
    check_read_range,
    corrupt_blob_error,
    digest_from_relpath,
    locked_progress,
    open_range,
    run_parallel,
    short_blob_error,
    unique_parts,
    verified_into,
)
from .remote import NetworkBlobs

__all__ = ["S3BlobStore", "PRESIGN_MAX_SECONDS", "UPLOADER_META"]

MiB = 1024 * 1024
#: presigned URLs never live longer than this (15 minutes)
PRESIGN_MAX_SECONDS = 900
#: the object metadata key (``x-amz-meta-pt2reg-uploader``) a presigned PUT signs in: whose it was
UPLOADER_META = "pt2reg-uploader"
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.\-_]{1,61}[a-z0-9]$")
_MISSING_CODES = {"404", "NotFound", "NoSuchKey"}
_MISSING_UPLOAD_CODES = {"NoSuchUpload", "404", "NotFound"}
#: a ranged GET that starts at or past the object's end
_INVALID_RANGE_CODES = {"InvalidRange", "416", "RequestedRangeNotSatisfiable"}
_CONTENT_RANGE_RE = re.compile(r"bytes (\d+)-(\d+)/(\d+)")
_BAD_DIGEST_CODES = {"BadDigest", "InvalidDigest", "XAmzContentChecksumMismatch",
                     "XAmzContentSHA256Mismatch"}
#: What boto3 and s3transfer raise; ``_translated`` turns each into one of our errors.
_BACKEND_ERRORS = (ClientError, BotoCoreError, RetriesExceededError)
#: Errors while reading a GET's body after botocore returned it (s3transfer's list): a
#: streamed blob asks again for the rest, up to ``_STREAM_ATTEMPTS`` times in all.
_RETRYABLE_READ_ERRORS = S3_RETRYABLE_DOWNLOAD_ERRORS
_STREAM_ATTEMPTS = 5
#: A streamed blob's read size: under the 1 MiB mmap threshold ``_limit_malloc_arenas`` pins,
#: so each read reuses heap memory (1 MiB reads were each mmap-ed and faulted in afresh:
#: measured, 62,000 page faults and +30% CPU pulling 384 MiB).
_STREAM_READ = 512 * 1024


class S3BlobStore(NetworkBlobs):
    """Blobs as objects under ``s3://bucket/prefix``; uploads verified before they complete.

    The constructor does no IO; the boto3 client is created on first use (or passed in).
    ``multipart_*`` and ``max_concurrency`` tune transfers (tests lower the threshold to
    exercise the multipart path with small files); the threshold defaults to
    ``registry.constants.s3_multipart_threshold()`` (64 MiB, or ``PT2REG_S3_MULTIPART_THRESHOLD``).
    """

    #: beyond ``NetworkBlobs``: presigned URLs for the server to hand out
    presigns = True

    def __init__(self, url: str, *, multipart_threshold: int | None = None,
                 multipart_chunksize: int = 8 * MiB, max_concurrency: int = 4,
                 client=None) -> None:
        if multipart_threshold is None:
            multipart_threshold = s3_multipart_threshold()
        self.bucket, self.prefix = _parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
        #: the key prefix every blob is under (listings start here)
        self._top = f"{self.prefix}/{BLOBS_DIR}/" if self.prefix else f"{BLOBS_DIR}/"
        self._client = client
        self._presigner = None
        self._client_lock = threading.Lock()
        self._max_concurrency = max_concurrency
        #: get_parts streams a blob up to this size through one GET (see ``_stream``)
        self._stream_limit = max(multipart_threshold, multipart_chunksize)
        # Memory is bounded by s3transfer's in-memory windows, shared by every transfer of one
        # manager (put_parts, and get_parts for blobs over _stream_limit, run up to
        # max_concurrency blobs through one; a streamed blob holds one 512 KiB read): about
        # max_concurrency + 2 parts, plus one part read ahead by each uploading blob (80 MiB
        # with the defaults), plus the queue of 256 KiB writes waiting for the IO thread
        # (default 1000 of them; 64 are plenty).
        self._transfer_config = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_chunksize,
            max_request_concurrency=max_concurrency,
            max_in_memory_upload_chunks=max_concurrency + 2,
            max_in_memory_download_chunks=max_concurrency + 2,
            max_io_queue_size=64,
        )
        # Downloads through s3transfer always take its ranged path, even for one small part:
        # only that path puts writes through its ordering queue, which drops the bytes a
        # retried GET sends again. Its single-GET path writes straight to the target and, on a retry after
        # a connection dropped mid-body, writes the start of the object a second time, which
        # an unseekable hashing writer can only report as a corrupt blob.
        self._download_config = TransferConfig(
            multipart_threshold=1,
            multipart_chunksize=multipart_chunksize,
            max_request_concurrency=max_concurrency,
            max_in_memory_download_chunks=max_concurrency + 2,
            max_io_queue_size=64,
        )

    def __repr__(self) -> str:
        return f"S3BlobStore({self.url!r})"

    # -- writing -------------------------------------------------------------------------------

    def put_file(self, path: str | os.PathLike, digest: str, *, offset: int = 0,
                 length: int | None = None, progress: ProgressFn | None = None) -> bool:
        """Upload bytes ``[offset, offset+length)`` of ``path``; verified before it completes.

        Returns False (and uploads nothing) when the blob is already stored intact (its stored
        ``ChecksumSHA256`` is this digest; anything else is replaced).
        """
        with open_range(path, offset, length) as (_src, length):  # NotFoundError if missing
            pass
        if self._stored_intact(path, Part(digest, offset, length)):
            return False
        with open_range(path, offset, length) as (src, length):
            self._upload(VerifyingReader(src, digest, size=length), digest, length, progress)
        return True

    def put_stream(self, fp: BinaryIO, digest: str, *, size: int | None = None,
                   progress: ProgressFn | None = None) -> bool:
        """Upload ``size`` bytes of ``fp`` (or all of it) in bounded parts, hashing on the way
        (a stored copy is kept only when its ``ChecksumSHA256`` is this digest)."""
        if self._checksum_state(digest, size) is True:
            return False
        self._upload(VerifyingReader(fp, digest, size=size), digest, size, progress)
        return True

    def put_bytes(self, data: bytes, digest: str) -> bool:
        """Upload ``data`` under ``digest``."""
        return self.put_stream(io.BytesIO(data), digest, size=len(data))

    def put_parts(self, path: str | os.PathLike, parts: Sequence[Part], *,
                  progress: ProgressFn | None = None, unrecorded: Collection[str] = ()) -> tuple[int, int]:
        """Upload ranges of ``path``, several blobs at once through one transfer manager (its
        part window bounds memory for all of them together), each verified before it
        completes. Returns (bytes uploaded, bytes already stored). A blob in ``unrecorded``
        (no version records it) is uploaded without a HEAD first: a new model's push costs
        one request per chunk, not two (a leftover object is replaced by the same bytes)."""
        progress = locked_progress(progress)
        todo, repeated = unique_parts(parts)
        if progress is not None and repeated:
            progress(repeated)
        manager, inflight = self._transfer_manager(), _Inflight()

        def one(part: Part) -> tuple[int, int]:
            # skipped only when the stored object provably holds these bytes (its SHA-256
            # checksum, kept by S3, is the digest); same size is not enough: a planted or
            # damaged object is replaced
            if part.digest not in unrecorded and self._stored_intact(path, part):
                if progress is not None:
                    progress(part.size)
                return 0, part.size
            with open_range(path, part.offset, part.size) as (src, n):
                self._upload(VerifyingReader(src, part.digest, size=n), part.digest, n, progress,
                             manager=manager, inflight=inflight)
            return n, 0

        with manager:
            done = run_parallel(one, todo, self._max_concurrency, on_error=inflight.cancel)
        return sum(u for u, _ in done), sum(s for _, s in done) + repeated

    def _upload(self, reader: VerifyingReader, digest: str, size: int | None,
                progress: ProgressFn | None, *, manager: TransferManager | None = None,
                inflight: _Inflight | None = None) -> None:
        key = self._key(digest)
        subscribers = _subscribers(progress, size)
        # S3 keeps a SHA-256 of every object, so a later push can tell a stored copy holds these
        # bytes without reading it. One PUT: the digest *is* that checksum, sent for the server
        # to check and keep (no second hash here). Multipart: per-part SHA-256s, which S3 keeps
        # as a composite ("<b64>-<parts>", see _composite_of_range).
        if size is not None and size < self._transfer_config.multipart_threshold:
            extra = {"ChecksumSHA256": _b64_digest(digest), "ChecksumAlgorithm": "SHA256"}
        else:
            extra = {"ChecksumAlgorithm": "SHA256"}
        with self._translated("upload", digest), \
                contextlib.nullcontext(manager) if manager else self._transfer_manager() as tm:
            future = tm.upload(reader, self.bucket, key, extra_args=extra, subscribers=subscribers)
            with inflight.track(future) if inflight else contextlib.nullcontext():
                future.result()

    # -- reading -------------------------------------------------------------------------------

    def exists(self, digest: str) -> bool:
        """True when the blob is stored (one HEAD request)."""
        try:
            self._stat(digest)
        except NotFoundError as exc:
            if exc.what == "bucket":
                raise
            return False
        return True

    def _stored_intact(self, path: str | os.PathLike, part: Part) -> bool:
        """True when the object stored under ``part.digest`` provably holds ``part``'s bytes of
        ``path`` (which are verified against the digest on the way)."""
        state = self._checksum_state(part.digest, part.size)
        if state is True:
            check_range(path, part)
            return True
        # multipart: its per-part SHA-256s must match the verified local bytes
        return bool(state) and _composite_of_range(path, part, state[1]) == state[0]

    def _checksum_state(self, digest: str, size: int | None) -> bool | tuple[str, int] | None:
        """What the store holds under ``digest``: True when it provably is those bytes (size
        matches and its stored full-object ``ChecksumSHA256`` is the digest); ``(composite
        checksum, part size)`` for a multipart object, to compare with the local bytes
        (:func:`_composite_of_range`); None when missing, of another size, or without a usable
        SHA-256 (uploaded by something else, or before checksums were stored): then it is
        uploaded again, which replaces it and stores the checksum. Both moto and SeaweedFS keep
        and return these checksums (tests/unit/test_blobs_s3_moto.py, test_store_integrity.py).
        """
        key = self._key(digest)
        try:
            with self._translated("stat", digest):
                head = self._s3().head_object(Bucket=self.bucket, Key=key, ChecksumMode="ENABLED")
        except NotFoundError as err:
            if err.what == "bucket":
                raise
            return None
        if size is not None and head["ContentLength"] != size:
            return None
        checksum = head.get("ChecksumSHA256") or ""
        if checksum == _b64_digest(digest):
            return True
        base, dash, parts = checksum.rpartition("-")
        if not dash:  # moto leaves the part count out of a composite; the ETag has it
            base, parts = checksum, str(head.get("ETag", "")).strip('"').rpartition("-")[2]
        if not (base and parts.isdigit()) or size is None:
            return None
        try:
            first = self._s3().head_object(Bucket=self.bucket, Key=key, PartNumber=1)
        except (ClientError, BotoCoreError):
            return None
        part_size = int(first["ContentLength"])
        if part_size <= 0 or -(-size // part_size) != int(parts):
            return None
        return f"{base}-{int(parts)}", part_size

    def stat(self, digest: str) -> BlobInfo:
        """Size and mtime (LastModified); ``NotFoundError`` if the blob or the bucket is missing."""
        return self._stat(digest, check_bucket=True)

    def _stat(self, digest: str, *, check_bucket: bool = False) -> BlobInfo:
        with self._translated("stat", digest, check_bucket=check_bucket):
            head = self._s3().head_object(Bucket=self.bucket, Key=self._key(digest))
        return BlobInfo(digest=digest, size=head["ContentLength"],
                        mtime=head["LastModified"].timestamp())

    def get_file(self, digest: str, dest: str | os.PathLike, *,
                 progress: ProgressFn | None = None) -> None:
        """Download to ``dest`` via ``dest.incomplete``, hashing while writing; ``IntegrityError``
        (and no file left behind) when the stored bytes do not match ``digest``."""
        size = self.stat(digest).size
        with atomic_download(dest, digest, self.url) as out:
            self._download(digest, out, size, progress)

    def _download(self, digest: str, writer: BinaryIO, size: int, progress: ProgressFn | None) -> None:
        """One object into an unseekable (hashing) writer, parts fetched in parallel, in order."""
        with self._translated("download", digest, check_bucket=True), \
                self._transfer_manager(download=True) as manager:
            manager.download(self.bucket, self._key(digest), writer,
                             subscribers=_subscribers(progress, size)).result()

    def get_parts(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                  on_done: Callable[[int], None] | None = None) -> None:
        """Download blobs into ranges of the open file ``fd``, several at once, each hashed in
        order and verified before ``on_done``.

        A blob up to the multipart threshold (a bundle's chunks, 64 MiB pieces at most) is one
        ranged GET streamed by its own worker: read, hashed and ``pwrite``-n at its offset in
        the same thread, so the blobs hash on every core at once, with one read buffer per
        worker and no ordering queue. A body cut off mid-way is resumed from the first byte
        not yet received (a sequential stream: the hash just goes on). A larger blob goes
        through s3transfer's ranged download (its parts in parallel, handed over in order).
        """
        inflight = _Inflight()
        big = any(part.size > self._stream_limit for part in parts)
        manager = self._transfer_manager(download=True) if big else None
        with manager if manager is not None else contextlib.nullcontext():
            run_calls(self._fetches(fd, parts, progress, on_done, inflight, manager), self._max_concurrency,
                      on_error=inflight.cancel)

    def part_fetches(self, fd: int, parts: Sequence[Part], *, progress: ProgressFn | None = None,
                     on_done: Callable[[int], None] | None = None) -> list[Callable[[], None]]:
        """``get_parts``' calls, one per part, for a caller that runs them itself. A blob over
        the streaming limit (a multipart threshold set below the chunk size) goes through an
        s3transfer download of its own, one at a time (each such download holds its window of
        ``max_concurrency + 2`` parts: however many threads call, memory stays that bound)."""
        return self._fetches(fd, parts, progress, on_done, _Inflight(), None)

    def _fetches(self, fd: int, parts: Sequence[Part], progress: ProgressFn | None,
                 on_done: Callable[[int], None] | None, inflight: _Inflight,
                 manager: TransferManager | None) -> list[Callable[[], None]]:
        _limit_malloc_arenas()
        progress = locked_progress(progress)
        one_big = threading.Lock()   # without ``manager``: the blobs over the streaming limit, one at a time

        def one(i: int) -> None:
            part = parts[i]
            if manager is None and part.size > self._stream_limit:
                with one_big, self._transfer_manager(download=True) as own:
                    self._get_part(fd, part, progress, inflight, own)
            else:
                self._get_part(fd, part, progress, inflight, manager)
            if on_done is not None:
                on_done(i)

        return [functools.partial(one, i) for i in range(len(parts))]

    def _get_part(self, fd: int, part: Part, progress: ProgressFn | None, inflight: _Inflight,
                  manager: TransferManager | None) -> None:
        """One blob into its range of ``fd``, verified: streamed (``_stream``), or through
        ``manager`` when it is over the streaming limit."""
        target = PwriteWriter(fd, part.offset, part.size, part.digest)
        with self._translated("download", part.digest, check_bucket=True), \
                verified_into(target, part.digest, self.url) as writer:
            if manager is None or part.size <= self._stream_limit:
                self._stream(part, writer, progress, inflight)
            else:
                future = manager.download(self.bucket, self._key(part.digest), writer,
                                          subscribers=_subscribers(progress, part.size))
                with inflight.track(future):
                    future.result()
        if writer.count != part.size:
            raise IntegrityError(f"blob {part.digest} has {writer.count} bytes, expected {part.size}",
                                 hint="the version's manifest does not match the store")

    def _stream(self, part: Part, writer: BinaryIO, progress: ProgressFn | None,
                inflight: _Inflight) -> None:
        """The blob's ``part.size`` bytes into ``writer``, in order, from ranged GETs: a body
        cut off (a dropped connection, a read timeout) is asked for again from the next byte
        needed, up to ``_STREAM_ATTEMPTS`` times (what s3transfer allows a part); an answer
        that is not the range asked for, or an object of another size, is refused."""
        key, got, failures = self._key(part.digest), 0, 0
        while True:
            args = {"Range": f"bytes={got}-{part.size - 1}"} if part.size else {}
            response = self._s3().get_object(Bucket=self.bucket, Key=key, **args)
            body = response["Body"]
            try:
                _check_content_range(part, got, response)
                while True:
                    if inflight.cancelled:  # another blob of the batch failed: it is what is reported
                        raise CancelledError(f"download of {part.digest} cancelled")
                    data = body.read(_STREAM_READ)
                    if not data:
                        break
                    writer.write(data)
                    got += len(data)
                    if progress is not None:
                        progress(len(data))
                return
            except _RETRYABLE_READ_ERRORS as exc:
                if part.size and got == part.size:
                    return  # every byte arrived before the connection failed: the digest decides
                failures += 1
                if failures >= _STREAM_ATTEMPTS:
                    raise RetriesExceededError(exc) from exc
            finally:
                body.close()

    def open(self, digest: str) -> BinaryIO:
        """The raw, unverified object body (a botocore ``StreamingBody``); close it when done."""
        return self._get_object(digest)["Body"]

    def read_range(self, digest: str, offset: int, length: int) -> bytes:
        """Bytes ``[offset, offset+length)`` of the object, raw and unverified, from ranged GETs
        (``_range_pieces``). ``NotFoundError`` if missing; ``IntegrityError`` when the object
        is shorter than ``offset + length``, or the answer is not the range asked for."""
        with contextlib.closing(self._range_pieces(digest, offset, length)) as pieces:
            return b"".join(pieces)

    def read_range_into(self, digest: str, offset: int, length: int, out: RangeSink) -> None:
        """``read_range``'s bytes into ``out`` as they arrive, ``_STREAM_READ`` at a time, from
        one ranged GET (more only when a body is cut off). What ``out.write`` raises is never
        taken for a failed read."""
        with contextlib.closing(self._range_pieces(digest, offset, length)) as pieces:
            for data in pieces:
                out.write(data)

    def _range_pieces(self, digest: str, offset: int, length: int) -> Iterator[bytes]:
        """The bytes of ``[offset, offset+length)``, in order, ``_STREAM_READ`` at a time: a
        ranged GET (botocore retries each request; a body cut off mid-way is asked for again
        from the next byte, up to ``_STREAM_ATTEMPTS`` times in all, as ``_stream`` does)."""
        check_read_range(digest, offset, length)
        key, end = self._key(digest), offset + length - 1
        got = failures = 0
        with self._translated("read", digest, check_bucket=True):
            while True:
                start = offset + got
                try:
                    response = self._s3().get_object(Bucket=self.bucket, Key=key, Range=f"bytes={start}-{end}")
                except ClientError as exc:
                    if _error_code(exc) in _INVALID_RANGE_CODES:  # offset at or past the end
                        raise short_blob_error(digest, offset, length, self.url, _actual_size(exc)) from exc
                    raise
                body = response["Body"]
                try:
                    _check_span(digest, offset, length, start, response, self.url)
                    while got < length:
                        try:
                            data = body.read(min(_STREAM_READ, length - got))
                        except _RETRYABLE_READ_ERRORS as exc:
                            failures += 1
                            if failures >= _STREAM_ATTEMPTS:
                                raise RetriesExceededError(exc) from exc
                            break
                        if not data:  # botocore checks the length: a bare early end is not the range
                            raise IntegrityError(f"blob {digest}: the store ended bytes {offset}-{end} after "
                                                 f"{got} bytes", hint="the S3 server does not honour ranged GETs")
                        got += len(data)
                        yield data
                    if got == length:
                        return
                finally:
                    body.close()

    def read_bytes(self, digest: str, *, max_size: int) -> bytes:
        """The verified content; ``IntegrityError`` when it is larger than ``max_size``."""
        response = self._get_object(digest)
        with contextlib.closing(response["Body"]) as body:
            if response["ContentLength"] > max_size:
                raise IntegrityError(f"blob {digest} is larger than the limit of {max_size} bytes")
            with self._translated("read", digest):
                data = body.read(max_size + 1)
        if len(data) > max_size:
            raise IntegrityError(f"blob {digest} is larger than the limit of {max_size} bytes")
        got = sha256_bytes(data)
        if "sha256:" + got != digest:
            raise corrupt_blob_error(digest, got, self.url)
        return data

    # -- presigned access (the registry server hands these to its clients) ----------------------

    def presign_put(self, digest: str, size: int, expires: int = PRESIGN_MAX_SECONDS, *,
                    uploader: str | None = None) -> tuple[str, dict[str, str]]:
        """A URL that lets its holder PUT exactly this blob, for at most ``expires`` seconds
        (capped at ``PRESIGN_MAX_SECONDS``), and the headers the PUT must carry. The
        ``x-amz-checksum-sha256`` header (the digest), ``x-amz-sdk-checksum-algorithm`` and
        ``Content-Length`` (``size``) are signed (SigV4), so S3 refuses the upload unless the
        body has that size and hashes to the digest, and stores the checksum for :meth:`head`
        (moto keeps it only when the algorithm header comes too). ``uploader``: who the URL is
        for, signed as the object's ``UPLOADER_META`` metadata (:meth:`head_info` reads it back),
        so the object says whose PUT wrote it last."""
        if not isinstance(size, int) or size < 0:
            raise UsageError(f"invalid blob size {size!r}")
        checksum = _b64_digest(digest)
        params = {"Bucket": self.bucket, "Key": self._key(digest), "ChecksumSHA256": checksum,
                  "ChecksumAlgorithm": "SHA256", "ContentLength": size}
        headers = {"x-amz-checksum-sha256": checksum, "x-amz-sdk-checksum-algorithm": "SHA256"}
        if uploader is not None:
            params["Metadata"] = {UPLOADER_META: uploader}
            headers[f"x-amz-meta-{UPLOADER_META}"] = uploader
        with self._translated("presign", digest):
            url = self._signer().generate_presigned_url(
                "put_object", Params=params, ExpiresIn=_presign_seconds(expires), HttpMethod="PUT")
        return url, headers

    def presign_get(self, digest: str, expires: int = PRESIGN_MAX_SECONDS) -> str:
        """A URL that lets its holder GET this one blob (Range allowed) for at most
        ``expires`` seconds (capped at ``PRESIGN_MAX_SECONDS``)."""
        with self._translated("presign", digest):
            return self._signer().generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": self._key(digest)},
                ExpiresIn=_presign_seconds(expires), HttpMethod="GET")

    def head(self, digest: str) -> tuple[int, str | None]:
        """``(size, ChecksumSHA256)`` of a stored blob; the checksum is base64 (``...-N`` for a
        multipart object's composite) or None when S3 stored none. ``NotFoundError`` if missing."""
        return self.head_info(digest)[:2]

    def head_info(self, digest: str) -> tuple[int, str | None, str | None]:
        """``head``'s ``(size, checksum)`` and the uploader a presigned PUT recorded
        (``presign_put(uploader=...)``; None for an object written otherwise)."""
        with self._translated("stat", digest, check_bucket=True):
            head = self._s3().head_object(Bucket=self.bucket, Key=self._key(digest),
                                          ChecksumMode="ENABLED")
        return (int(head["ContentLength"]), head.get("ChecksumSHA256") or None,
                (head.get("Metadata") or {}).get(UPLOADER_META))

    @staticmethod
    def full_object_checksum(digest: str) -> str:
        """The ``ChecksumSHA256`` S3 reports for a single-part object holding this blob."""
        return _b64_digest(digest)

    def _get_object(self, digest: str) -> dict:
        with self._translated("read", digest, check_bucket=True):
            return self._s3().get_object(Bucket=self.bucket, Key=self._key(digest))

    def delete(self, digest: str) -> None:
        """Remove the blob; a missing blob is fine (a missing bucket is not)."""
        try:
            with self._translated("delete", digest):
                self._s3().delete_object(Bucket=self.bucket, Key=self._key(digest))
        except NotFoundError as err:
            if err.what != "blob":
                raise

    def list(self) -> Iterator[BlobInfo]:
        """Every stored blob, listed page by page; keys that are not blobs are ignored."""
        paginator = self._s3().get_paginator("list_objects_v2")
        with self._translated("list", None, check_bucket=True):
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._top):
                for obj in page.get("Contents", ()):
                    digest = self._digest_of_key(obj["Key"])
                    if digest is not None:
                        yield BlobInfo(digest=digest, size=obj["Size"],
                                       mtime=obj["LastModified"].timestamp())

    def abort_stale_uploads(self, older_than_seconds: float = 0.0, *,
                            keep: Iterable[str] | Callable[[], Iterable[str]] = (),
                            dry_run: bool = False) -> list[str]:
        """Abort multipart uploads of blobs that no live push is writing: initiated at least
        ``older_than_seconds`` ago, for a blob not in ``keep`` (the digests live pushes claim).
        Their parts are invisible to readers but stored (and billed) until aborted. Returns the
        digests whose uploads were (or, with ``dry_run``, would be) aborted.

        ``keep`` may be a callable: it is then called after the listing, so a push that claims
        its blobs before it starts uploading (as ``Registry.push`` does) is always spared.
        """
        aborted = []
        with self._translated("cleanup", None, check_bucket=True):
            candidates = []
            paginator = self._s3().get_paginator("list_multipart_uploads")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self._top):
                for upload in page.get("Uploads", ()):
                    digest = self._digest_of_key(upload["Key"])
                    age = time.time() - upload["Initiated"].timestamp()
                    if digest is not None and age >= older_than_seconds:
                        candidates.append((digest, upload["Key"], upload["UploadId"]))
            spared = set(keep() if callable(keep) else keep)
            for digest, key, upload_id in candidates:
                if digest in spared:
                    continue
                if not dry_run:
                    try:
                        self._s3().abort_multipart_upload(Bucket=self.bucket, Key=key, UploadId=upload_id)
                    except ClientError as exc:  # completed or aborted meanwhile
                        if exc.response.get("Error", {}).get("Code") not in _MISSING_UPLOAD_CODES:
                            raise
                aborted.append(digest)
        return aborted

    # -- internals -----------------------------------------------------------------------------

    def _key(self, digest: str) -> str:
        relpath = blob_relpath(digest)
        return f"{self.prefix}/{relpath}" if self.prefix else relpath

    def _digest_of_key(self, key: str) -> str | None:
        """The digest a listed key stands for (None for a key that is not a blob)."""
        fan, _, name = key[len(self._top):].partition("/")
        return digest_from_relpath(fan, name)

    @contextlib.contextmanager
    def _translated(self, action: str, digest: str | None, *, check_bucket: bool = False) -> Iterator[None]:
        """Around every S3 call: a boto3/s3transfer failure becomes one of our errors, in one
        line (:meth:`_error`); a ``RegistryError`` (say an ``IntegrityError`` raised by a
        verifying reader or writer inside the transfer) passes through untouched."""
        try:
            yield
        except _BACKEND_ERRORS as exc:
            raise self._error(exc, action, digest, check_bucket=check_bucket) from exc

    def _s3(self):
        with self._client_lock:
            if self._client is None:
                session = _botocore_session()
                config = Config(
                    retries=_retry_config(session),
                    connect_timeout=10,
                    read_timeout=120,
                    max_pool_connections=max(10, 2 * self._max_concurrency),
                    # No SigV4 hash of every body: botocore skips it by itself over HTTPS when a
                    # checksum header is sent, but over plain HTTP (an in-cluster endpoint) it
                    # would hash each upload once more. Every body here carries a SHA-256 the
                    # server checks (x-amz-checksum-sha256: the digest itself for one PUT, per
                    # part for multipart) besides our own hash, so that pass protects nothing
                    # (2 GiB push: 1.4 s of client CPU, benchmarks/README.md "Scale").
                    s3={"payload_signing_enabled": False},
                )
                self._client = boto3.session.Session(botocore_session=session).client("s3", config=config)
            return self._client

    def _signer(self):
        """A client for presigning: SigV4 always (the checksum and length headers are part
        of the signature only there); presigning is local, no request is sent."""
        with self._client_lock:
            if self._presigner is None:
                session = _botocore_session()
                self._presigner = boto3.session.Session(botocore_session=session).client(
                    "s3", config=Config(signature_version="s3v4"))
            return self._presigner

    def _transfer_manager(self, *, download: bool = False) -> TransferManager:
        _limit_malloc_arenas()
        return TransferManager(self._s3(), self._download_config if download else self._transfer_config)

    def _endpoint(self) -> str:
        return self._s3().meta.endpoint_url

    def _bucket_missing(self) -> bool:
        try:
            self._s3().head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            return exc.response.get("Error", {}).get("Code") in {"404", "NoSuchBucket", "NotFound"}
        except BotoCoreError:
            return False
        return False

    def _error(self, exc: Exception, action: str, digest: str | None, *,
               check_bucket: bool = False) -> RegistryError:
        """Translate a botocore/s3transfer failure into one of our errors, in one line."""
        where = f"s3://{self.bucket}/{self._key(digest)}" if digest else self.url
        code = ""
        if isinstance(exc, ClientError):
            code = str(exc.response.get("Error", {}).get("Code", ""))
        # HEAD answers a missing bucket with a bare 404, and some servers (SeaweedFS) refuse
        # a PUT into one with AccessDenied: only a second request tells these cases apart.
        suspect = code in {"AccessDenied", "403"} or (check_bucket and code in {"404", "NotFound"})
        if code == "NoSuchBucket" or (suspect and self._bucket_missing()):
            return NotFoundError(f"bucket {self.bucket!r} does not exist at {self._endpoint()}",
                                 what="bucket", name=self.bucket,
                                 hint="create it, or fix the store URL / AWS_ENDPOINT_URL")
        if code in _MISSING_CODES and digest:
            return NotFoundError(f"blob {digest} not found in {self.url}", what="blob", name=digest)
        if code in _BAD_DIGEST_CODES or isinstance(exc, FlexibleChecksumError):
            return IntegrityError(f"S3 {action} of {where} failed its transfer checksum: {_oneline(exc)}")
        if isinstance(exc, NoCredentialsError):
            return StoreError(f"S3 {action} of {where} failed: no AWS credentials found",
                              hint="set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY or an AWS profile")
        if code in {"AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch"}:
            return StoreError(f"S3 {action} of {where} was denied ({code})",
                              hint="check the AWS credentials and the bucket policy")
        return StoreError(f"S3 {action} of {where} at {self._endpoint()} failed: {_oneline(exc)}")


class _Inflight:
    """The transfers of a batch still running, so the first failure can cancel the others
    (``TransferFuture.cancel``; s3transfer's own ``shutdown(cancel=True)`` mis-passes its
    arguments in the versions we support; a streamed blob checks ``cancelled`` between reads)."""

    def __init__(self) -> None:
        self._futures: set = set()
        self._lock = threading.Lock()
        self._cancelled = False

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    @contextlib.contextmanager
    def track(self, future) -> Iterator[None]:
        with self._lock:
            self._futures.add(future)
            if self._cancelled:
                future.cancel()
        try:
            yield
        finally:
            with self._lock:
                self._futures.discard(future)

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            for future in self._futures:
                future.cancel()


class _KnownSize(BaseSubscriber):
    """Tells s3transfer a size we already know (saves a HEAD before downloads)."""

    def __init__(self, size: int) -> None:
        self._size = size

    def on_queued(self, future, **kwargs) -> None:
        future.meta.provide_transfer_size(self._size)


class _Progress(BaseSubscriber):
    """Forwards s3transfer's progress (reported from worker threads) to one callback, serialized."""

    def __init__(self, progress: ProgressFn) -> None:
        self._progress = progress
        self._lock = threading.Lock()

    def on_progress(self, future, bytes_transferred: int, **kwargs) -> None:
        with self._lock:
            self._progress(bytes_transferred)


def _subscribers(progress: ProgressFn | None, size: int | None = None) -> list[BaseSubscriber]:
    """Progress forwarding, and the transfer's size when known (spares s3transfer a HEAD, or
    buffering a threshold of an unseekable upload to choose between PutObject and multipart)."""
    return ([_Progress(progress)] if progress is not None else []) + \
        ([_KnownSize(size)] if size is not None else [])


def _check_content_range(part: Part, start: int, response: dict) -> None:
    """A ranged GET answered with exactly ``bytes start-(size-1)/size`` (so a resumed body
    continues where the last one stopped); anything else (a server that ignored the range,
    an object of another size) raises ``IntegrityError``."""
    if not part.size:
        return
    expected = f"bytes {start}-{part.size - 1}/{part.size}"
    got = str(response.get("ContentRange") or "")
    if got != expected:
        total = got.rpartition("/")[2]
        if total.isdigit() and int(total) != part.size:
            raise IntegrityError(f"blob {part.digest} has {total} bytes, expected {part.size}",
                                 hint="the version's manifest does not match the store")
        raise IntegrityError(f"blob {part.digest}: asked the store for bytes {start}-{part.size - 1}, "
                             f"it answered {got or 'the whole object'}",
                             hint="the S3 server does not honour ranged GETs")


def _check_span(digest: str, offset: int, length: int, start: int, response: dict, where: str) -> None:
    """A ``read_range`` GET answered with exactly ``bytes start-(offset+length-1)/total``;
    ``IntegrityError`` otherwise: ``short_blob_error`` when the object has fewer than
    ``offset + length`` bytes (S3 cuts a range at the object's end), else a refused range."""
    end = offset + length - 1
    got = str(response.get("ContentRange") or "")
    m = _CONTENT_RANGE_RE.fullmatch(got)
    if m and int(m.group(3)) < offset + length:
        raise short_blob_error(digest, offset, length, where, int(m.group(3)))
    if not m or (int(m.group(1)), int(m.group(2))) != (start, end):
        raise IntegrityError(f"blob {digest}: asked the store for bytes {start}-{end}, "
                             f"it answered {got or 'the whole object'}",
                             hint="the S3 server does not honour ranged GETs")


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _actual_size(exc: ClientError) -> int | None:
    """The object's size an ``InvalidRange`` answer names (AWS sends ``ActualObjectSize``)."""
    size = str(exc.response.get("Error", {}).get("ActualObjectSize", ""))
    return int(size) if size.isdigit() else None


def _presign_seconds(expires: int) -> int:
    if not isinstance(expires, int) or expires < 1:
        raise UsageError(f"invalid presigned URL lifetime {expires!r}", hint="a positive number of seconds")
    return min(expires, PRESIGN_MAX_SECONDS)


def _b64_digest(digest: str) -> str:
    """The base64 form S3 uses for a SHA-256 (``ChecksumSHA256``) of a ``sha256:<hex>`` digest."""
    import base64

    return base64.b64encode(bytes.fromhex(digest.split(":", 1)[1])).decode("ascii")


def _composite_of_range(path: str | os.PathLike, part: Part, part_size: int) -> str:
    """S3's composite ``ChecksumSHA256`` of a multipart object holding ``part``'s bytes of
    ``path`` uploaded in ``part_size`` parts (base64 of the SHA-256 of the parts' raw
    SHA-256s, then ``-<parts>``). The range is verified against ``part.digest`` in the same
    read (IntegrityError otherwise), so a match proves the stored object is these bytes."""
    import base64
    import hashlib

    digests = []
    with open_range(path, part.offset, part.size) as (src, n):
        reader = VerifyingReader(src, part.digest, size=n)
        while True:
            got, count = sha256_stream(reader, part_size)
            if count:
                digests.append(bytes.fromhex(got))
            if count < part_size:
                break
        reader.read(1)  # EOF: the whole range's digest is checked now
    whole = hashlib.sha256(b"".join(digests)).digest()
    return f"{base64.b64encode(whole).decode('ascii')}-{len(digests)}"


_LOADER_LOCK = threading.Lock()
_SHARED_LOADER = None


def _botocore_session():
    """A new botocore session (credentials, region and endpoint read afresh from the
    environment and the AWS configuration, as ``boto3.session.Session()`` would) whose data
    loader is shared by every session of this process. The loader only reads botocore's and
    boto3's bundled JSON (the S3 service model, endpoints, partitions) and caches it parsed:
    without sharing it, each store's first client re-reads and re-parses those files (about
    50 ms, measured, out of a client's 80)."""
    import botocore.session
    from botocore.loaders import Loader

    global _SHARED_LOADER
    session = botocore.session.get_session()
    with _LOADER_LOCK:
        if _SHARED_LOADER is None:
            loader = session.get_component("data_loader")
            if not isinstance(loader, Loader):
                return session
            # boto3.session.Session() appends its own data folder to the loader's search paths
            # each time it is created: done once here, so the shared list never grows
            boto3_data = os.path.join(os.path.dirname(boto3.__file__), "data")
            if boto3_data not in loader.search_paths:
                loader.search_paths.append(boto3_data)
            _SHARED_LOADER = _SharedLoader(loader)
        session.register_component("data_loader", _SHARED_LOADER)
    return session


class _SharedLoader:
    """botocore's data loader, shared by this process's sessions: every call goes to it (and
    its caches), but ``search_paths`` is a copy, so what a new ``boto3.session.Session``
    appends to it (boto3's data folder, already there) is dropped instead of accumulating."""

    def __init__(self, loader) -> None:
        self._loader = loader

    @property
    def search_paths(self) -> list[str]:
        return list(self._loader.search_paths)

    def __getattr__(self, name: str):
        return getattr(self._loader, name)


def _retry_config(session) -> dict:
    """Retries with exponential backoff and jitter (botocore's "standard" mode: throttling,
    5xx and dropped connections), up to 10 retries unless the user's AWS configuration
    (``AWS_MAX_ATTEMPTS`` / ``max_attempts`` in ``~/.aws/config``, read through ``session``)
    says otherwise; an explicit ``AWS_RETRY_MODE=adaptive`` is kept as well."""
    retries: dict = {"mode": "adaptive" if session.get_config_variable("retry_mode") == "adaptive"
                     else "standard"}
    if session.get_config_variable("max_attempts") is None:
        retries["max_attempts"] = 10
    return retries


def _parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix/`` -> ``("bucket", "some/prefix")``."""
    if not url.startswith("s3://") or "?" in url or "#" in url:
        raise UsageError(f"invalid S3 store URL {url!r}", hint="use s3://BUCKET or s3://BUCKET/PREFIX")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    if not _BUCKET_RE.match(bucket):
        raise UsageError(f"invalid S3 bucket name {bucket!r} in {url!r}",
                         hint="3-63 lowercase letters, digits, '.', '-'")
    return bucket, prefix.strip("/")


def _oneline(exc: BaseException) -> str:
    return " ".join(str(exc).split())


_MALLOC_TUNED = False


def _limit_malloc_arenas() -> None:
    """Keep s3transfer's part buffers from inflating peak memory.

    Part buffers are allocated on several threads; glibc then raises its mmap threshold and
    keeps freed parts in per-thread arenas (measured: +216 MiB peak RSS pushing 384 MiB).
    Pinning the threshold at 1 MiB returns each freed part to the OS (+87 MiB: the transfer
    window itself). A no-op off glibc.
    """
    global _MALLOC_TUNED
    if _MALLOC_TUNED:
        return
    _MALLOC_TUNED = True
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        pass
