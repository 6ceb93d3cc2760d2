"""``BlobStore.read_range``: one raw stretch of a stored (pack) blob, never the whole blob.

``ReadRangeContract`` holds what every backend must do; the local store runs it here, S3 in
``tests/integration/test_blobs_seaweed.py`` (real SeaweedFS), the registry client through a real
``pt2reg serve`` in ``tests/integration/test_remote_e2e.py``.
"""
from __future__ import annotations

import hashlib
import os
import random

import pytest

from registry.blobs import LocalBlobStore
from registry.errors import IntegrityError, NotFoundError, UsageError

MiB = 1024 * 1024
#: an odd size, not a multiple of any read or part size
PACK_SIZE = 3 * MiB + 4321


def pack_bytes(size: int = PACK_SIZE, seed: int = 7) -> tuple[bytes, str]:
    """Bytes with no period (an offset off by any amount reads different bytes) and their digest."""
    data = random.Random(seed).randbytes(size)
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def assert_short(exc: pytest.ExceptionInfo, digest: str, first: int, last: int) -> None:
    """The short-blob error: one line naming the digest and the range, with a hint."""
    message = exc.value.message
    assert digest in message and f"bytes {first}-{last}" in message, message
    assert "\n" not in message
    assert exc.value.hint and "push the bundle again" in exc.value.hint


class ReadRangeContract:
    """What every store's ``read_range`` must do. Subclasses give a ``store`` fixture and
    ``replace`` (put other bytes under a digest behind the store's back)."""

    def replace(self, store, digest: str, data: bytes) -> None:
        raise NotImplementedError

    @pytest.fixture
    def pack(self, store) -> tuple[bytes, str]:
        data, digest = pack_bytes()
        store.put_bytes(data, digest)
        return data, digest

    def test_a_middle_range_is_exactly_those_bytes(self, store, pack):
        data, digest = pack
        got = store.read_range(digest, 1_000_003, 2 * MiB + 17)
        assert type(got) is bytes
        assert got == data[1_000_003:1_000_003 + 2 * MiB + 17]
        assert store.read_range(digest, 5, 1) == data[5:6]
        assert store.read_range(digest, 0, 100) == data[:100]

    def test_a_range_at_the_end(self, store, pack):
        data, digest = pack
        assert store.read_range(digest, len(data) - 777, 777) == data[-777:]
        assert store.read_range(digest, len(data) - 1, 1) == data[-1:]
        assert store.read_range(digest, 0, len(data)) == data

    @pytest.mark.parametrize("past", [1, 4096])
    def test_a_range_past_the_end_is_an_integrity_error(self, store, pack, past):
        data, digest = pack
        offset = len(data) - 100
        with pytest.raises(IntegrityError) as exc:
            store.read_range(digest, offset, 100 + past)
        assert_short(exc, digest, offset, offset + 100 + past - 1)

    @pytest.mark.parametrize("beyond", [0, 1, 10 * MiB])
    def test_a_range_starting_at_or_after_the_end_is_an_integrity_error(self, store, pack, beyond):
        data, digest = pack
        offset = len(data) + beyond
        with pytest.raises(IntegrityError) as exc:
            store.read_range(digest, offset, 10)
        assert_short(exc, digest, offset, offset + 9)

    def test_a_truncated_stored_pack(self, store, pack):
        data, digest = pack
        self.replace(store, digest, data[:MiB])
        # raw and unverified: what is still there reads as it is
        assert store.read_range(digest, MiB - 50, 50) == data[MiB - 50:MiB]
        with pytest.raises(IntegrityError) as exc:
            store.read_range(digest, MiB - 50, 51)
        assert_short(exc, digest, MiB - 50, MiB)
        with pytest.raises(IntegrityError):
            store.read_range(digest, 2 * MiB, 10)

    def test_a_missing_blob_is_not_found(self, store, pack):
        _, other = pack_bytes(1000, seed=8)
        with pytest.raises(NotFoundError) as exc:
            store.read_range(other, 0, 10)
        assert exc.value.what == "blob" and other in str(exc.value)

    @pytest.mark.parametrize("offset,length", [(-1, 10), (0, 0), (10, -1), (-5, 0), (1.5, 10), (0, True)])
    def test_a_bad_offset_or_length_is_a_usage_error(self, store, pack, offset, length):
        _, digest = pack
        with pytest.raises(UsageError):
            store.read_range(digest, offset, length)

    def test_a_malformed_digest_is_a_usage_error(self, store):
        with pytest.raises(UsageError):
            store.read_range("sha256:" + "A" * 64, 0, 10)


    def test_read_range_into_hands_over_the_same_bytes_in_order(self, store, pack):
        data, digest = pack
        for offset, length in [(1_000_003, 2 * MiB + 17), (0, len(data)), (len(data) - 1, 1)]:
            sink = Sink()
            assert store.read_range_into(digest, offset, length, sink) is None
            assert b"".join(sink.pieces) == data[offset:offset + length]
            assert all(sink.pieces) and max(map(len, sink.pieces)) <= 4 * MiB

    def test_read_range_into_fails_as_read_range_does(self, store, pack):
        data, digest = pack
        with pytest.raises(IntegrityError) as exc:
            store.read_range_into(digest, len(data) - 100, 101, Sink())
        assert_short(exc, digest, len(data) - 100, len(data))
        _, other = pack_bytes(1000, seed=8)
        with pytest.raises(NotFoundError):
            store.read_range_into(other, 0, 10, Sink())
        with pytest.raises(UsageError):
            store.read_range_into(digest, -1, 10, Sink())

    @pytest.mark.parametrize("error", [ConnectionError("the sink's own connection"), OSError(28, "No space left")])
    def test_what_the_sink_raises_stops_the_read_as_it_is(self, store, pack, error):
        """A sink's failure is not a failed read: never retried, nothing more read after it,
        the same exception (a ConnectionError too, which a store retries when reading)."""
        data, digest = pack
        sink = Sink(fail_at=1, error=error)
        with pytest.raises(type(error)) as exc:
            store.read_range_into(digest, 0, len(data), sink)
        assert exc.value is error and sink.calls == 1


class Sink:
    """A ``RangeSink`` keeping a copy of each piece (the store may reuse its buffer)."""

    def __init__(self, fail_at: int | None = None, error: BaseException | None = None) -> None:
        self.pieces: list[bytes] = []
        self.calls, self.fail_at, self.error = 0, fail_at, error

    def write(self, data) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise self.error
        self.pieces.append(bytes(data))


class TestLocalReadRange(ReadRangeContract):
    @pytest.fixture
    def store(self, tmp_path) -> LocalBlobStore:
        return LocalBlobStore(tmp_path / "store")

    def replace(self, store, digest, data):
        path = store._path(digest)
        path.chmod(0o644)
        path.write_bytes(data)

    def test_reads_only_the_range(self, store, pack, monkeypatch):
        data, digest = pack
        read = []
        real_pread = os.pread

        def pread(fd, n, offset):
            got = real_pread(fd, n, offset)
            read.append((offset, len(got)))
            return got

        monkeypatch.setattr(os, "pread", pread)
        assert store.read_range(digest, 2 * MiB, 4096) == data[2 * MiB:2 * MiB + 4096]
        assert read == [(2 * MiB, 4096)]

    def test_a_short_pread_is_continued(self, store, pack, monkeypatch):
        data, digest = pack
        real_pread = os.pread
        monkeypatch.setattr(os, "pread", lambda fd, n, offset: real_pread(fd, min(n, 1000), offset))
        assert store.read_range(digest, 12345, 5555) == data[12345:12345 + 5555]
