"""The blob store contract (``BlobStoreContract``, shared by every backend) and the local store.

Backends reuse the contract by subclassing it next to their own fixtures (moto in
``test_blobs_s3_moto.py``, SeaweedFS in ``tests/integration/test_blobs_seaweed.py``); a subclass
provides a ``store`` fixture and the raw hooks that look under the interface.
"""
from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from registry.blobs import BlobInfo, BlobStore, LocalBlobStore, open_blob_store
from registry.blobs.base import Part
from registry.errors import IntegrityError, NotFoundError, UsageError

MiB = 1024 * 1024


def blob(data: bytes) -> tuple[bytes, str]:
    return data, "sha256:" + hashlib.sha256(data).hexdigest()


def ranges_file(src: Path, pieces: list[bytes], header: bytes = b"") -> list[Part]:
    """``src`` written as ``header`` and then ``pieces`` back to back; the ``Part`` of each piece."""
    src.write_bytes(header + b"".join(pieces))
    parts, at = [], len(header)
    for piece in pieces:
        parts.append(Part(blob(piece)[1], at, len(piece)))
        at += len(piece)
    return parts


def relpath(digest: str) -> str:
    return f"blobs/sha256/{digest[7:9]}/{digest[7:]}"


class FailingStream(io.RawIOBase):
    """Gives ``good`` bytes, then fails like a dropped connection."""

    def __init__(self, good: bytes) -> None:
        self._good = io.BytesIO(good)

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        data = self._good.read(n)
        if not data:
            raise OSError("connection reset by peer")
        return data


MALFORMED = ["", "sha256:", "sha256:" + "A" * 64, "sha256:" + "a" * 63, "md5:" + "a" * 32,
             "a" * 64, "sha256:" + "g" * 64, "sha256:../../" + "a" * 58]


class BlobStoreContract:
    """What every ``BlobStore`` must do. Subclasses define the ``store`` fixture and the hooks."""

    #: Size of the "large" blob: several copy chunks locally, several parts on S3.
    big_size = 3 * MiB + 123

    # -- hooks: look under the interface ---------------------------------------------------------
    def raw_keys(self, store) -> set[str]:
        """Every stored object/file, relative to the store root (tmp area excluded)."""
        raise NotImplementedError

    def leftovers(self, store) -> list[str]:
        """Traces of unfinished uploads (tmp files, open multipart uploads)."""
        raise NotImplementedError

    def corrupt(self, store, digest: str, data: bytes) -> None:
        """Replace a stored blob's bytes behind the store's back."""
        raise NotImplementedError

    def add_junk(self, store) -> None:
        """Put non-blob entries where a careless ``list`` would pick them up."""
        raise NotImplementedError

    # -- writing ---------------------------------------------------------------------------------
    def test_is_a_blob_store(self, store):
        assert isinstance(store, BlobStore)

    def test_put_bytes_layout_and_round_trip(self, store):
        data, digest = blob(b"hello, blob")
        assert store.put_bytes(data, digest) is True
        assert self.raw_keys(store) == {relpath(digest)}
        assert store.exists(digest)
        info = store.stat(digest)
        assert (info.digest, info.size) == (digest, len(data)) and info.mtime > 0
        assert store.read_bytes(digest, max_size=len(data)) == data
        with store.open(digest) as fp:
            assert fp.read() == data
        assert self.leftovers(store) == []

    def test_puts_are_idempotent(self, store, tmp_path):
        data, digest = blob(b"same content")
        src = tmp_path / "src"
        src.write_bytes(data)
        calls = []
        assert store.put_bytes(data, digest) is True
        assert store.put_bytes(data, digest) is False
        assert store.put_file(src, digest, progress=calls.append) is False
        assert store.put_stream(io.BytesIO(data), digest, progress=calls.append) is False
        assert calls == []
        assert self.raw_keys(store) == {relpath(digest)}

    def test_put_file_large_with_progress(self, store, tmp_path):
        data, digest = blob(os.urandom(self.big_size))
        src = tmp_path / "big"
        src.write_bytes(data)
        calls = []
        assert store.put_file(src, digest, progress=calls.append) is True
        assert sum(calls) == len(data)
        assert store.stat(digest).size == len(data)
        assert store.read_bytes(digest, max_size=len(data)) == data

    def test_put_file_offset_and_length(self, store, tmp_path):
        member, digest = blob(os.urandom(70_000))
        src = tmp_path / "bundle"
        src.write_bytes(b"H" * 1234 + member + b"T" * 99)
        assert store.put_file(src, digest, offset=1234, length=len(member)) is True
        assert store.read_bytes(digest, max_size=len(member)) == member
        tail, tail_digest = blob(member[-500:] + b"T" * 99)
        assert store.put_file(src, tail_digest, offset=1234 + len(member) - 500) is True
        assert store.read_bytes(tail_digest, max_size=10_000) == tail

    @pytest.mark.parametrize("offset,length", [(0, 101), (90, 20), (101, 1), (-1, 5), (0, -1)])
    def test_put_file_range_outside_the_file(self, store, tmp_path, offset, length):
        src = tmp_path / "small"
        src.write_bytes(b"x" * 100)
        with pytest.raises(UsageError):
            store.put_file(src, blob(b"whatever")[1], offset=offset, length=length)
        assert self.raw_keys(store) == set()

    def test_put_file_missing_source(self, store, tmp_path):
        with pytest.raises(NotFoundError, match="not found"):
            store.put_file(tmp_path / "nope", blob(b"x")[1])

    def test_put_stream_unknown_size(self, store):
        data, digest = blob(os.urandom(self.big_size))
        calls = []
        assert store.put_stream(io.BytesIO(data), digest, progress=calls.append) is True
        assert sum(calls) == len(data)
        assert store.read_bytes(digest, max_size=len(data)) == data

    def test_put_stream_stops_at_size(self, store):
        data, digest = blob(b"exactly this")
        assert store.put_stream(io.BytesIO(data + b" and not this"), digest, size=len(data))
        assert store.read_bytes(digest, max_size=100) == data

    def test_put_bytes_empty_blob(self, store, tmp_path):
        data, digest = blob(b"")
        assert store.put_bytes(data, digest) is True
        assert store.stat(digest).size == 0
        store.get_file(digest, tmp_path / "empty")
        assert (tmp_path / "empty").read_bytes() == b""

    @pytest.mark.parametrize("how", ["bytes", "file", "big-file", "stream", "big-stream"])
    def test_wrong_content_is_rejected_and_leaves_nothing(self, store, tmp_path, how):
        size = self.big_size if how.startswith("big") else 5000
        data = os.urandom(size)
        wrong = blob(data[:-1] + bytes([data[-1] ^ 1]))[1]
        src = tmp_path / "src"
        src.write_bytes(data)
        with pytest.raises(IntegrityError, match=wrong):
            if how == "bytes":
                store.put_bytes(data, wrong)
            elif how.endswith("file"):
                store.put_file(src, wrong)
            else:
                store.put_stream(io.BytesIO(data), wrong)
        assert not store.exists(wrong)
        assert self.raw_keys(store) == set()
        assert self.leftovers(store) == []

    def test_short_stream_is_rejected(self, store):
        data, digest = blob(b"0123456789")
        with pytest.raises(IntegrityError, match="ended after 5 of 10 bytes"):
            store.put_stream(io.BytesIO(data[:5]), digest, size=10)
        assert self.raw_keys(store) == set() and self.leftovers(store) == []

    def test_failing_source_leaves_nothing(self, store):
        data, digest = blob(os.urandom(self.big_size))
        with pytest.raises(OSError, match="connection reset by peer"):  # the source's own error
            store.put_stream(FailingStream(data[: self.big_size // 2]), digest)
        assert not store.exists(digest)
        assert self.raw_keys(store) == set() and self.leftovers(store) == []

    # -- batches -------------------------------------------------------------------------------
    def _batch(self, tmp_path):
        """A file of five ranges: a big one, small ones, an empty one, and a repeat."""
        pieces = [os.urandom(self.big_size), os.urandom(5000), b"", os.urandom(70_000)]
        pieces.append(pieces[1])
        src = tmp_path / "batch"
        return src, pieces, ranges_file(src, pieces, b"#" * 33)

    def test_put_parts_stores_each_blob_once_and_counts_bytes(self, store, tmp_path):
        src, pieces, parts = self._batch(tmp_path)
        store.put_bytes(pieces[3], parts[3].digest)             # already stored
        seen = []
        uploaded, skipped = store.put_parts(src, parts, progress=seen.append)
        assert uploaded == sum(map(len, pieces[:3]))
        assert skipped == len(pieces[3]) + len(pieces[4])       # stored before, and the repeat
        assert sum(seen) == sum(map(len, pieces))
        for piece, part in zip(pieces, parts):
            assert store.read_bytes(part.digest, max_size=len(piece)) == piece
        assert len(self.raw_keys(store)) == 4 and self.leftovers(store) == []
        assert store.put_parts(src, parts) == (0, sum(map(len, pieces)))

    def test_put_parts_refuses_a_wrong_digest_and_stores_nothing_wrong(self, store, tmp_path):
        src, pieces, parts = self._batch(tmp_path)
        wrong = blob(pieces[0][:-1] + bytes([pieces[0][-1] ^ 1]))[1]
        parts[0] = Part(wrong, parts[0].offset, parts[0].size)
        with pytest.raises(IntegrityError, match=wrong):
            store.put_parts(src, parts)
        assert not store.exists(wrong)
        assert self.leftovers(store) == []
        for piece, part in zip(pieces[1:], parts[1:]):           # whatever was stored is right
            if store.exists(part.digest):
                assert store.read_bytes(part.digest, max_size=len(piece)) == piece

    def test_get_parts_writes_each_blob_in_its_place(self, store, tmp_path):
        src, pieces, parts = self._batch(tmp_path)
        store.put_parts(src, parts)
        body = b"".join(pieces)
        out, offset, placed = tmp_path / "out", 0, []
        for part in parts:
            placed.append(Part(part.digest, offset, part.size))
            offset += part.size
        done, seen = [], []
        with open(out, "wb") as f:
            store.get_parts(f.fileno(), placed, progress=seen.append, on_done=done.append)
        assert out.read_bytes() == body
        assert sorted(done) == list(range(len(parts)))
        assert sum(seen) == len(body)

    def test_part_fetches_are_get_parts_one_call_each_in_any_order(self, store, tmp_path):
        """What ``get_parts`` runs, handed out: each call fetches its part, verified, into its
        place, whatever thread runs it and in whatever order; a damaged blob fails its own call."""
        from registry.parallel import run_calls

        src, pieces, parts = self._batch(tmp_path)
        store.put_parts(src, parts)
        body = b"".join(pieces)
        placed, offset = [], 0
        for part in parts:
            placed.append(Part(part.digest, offset, part.size))
            offset += part.size
        done, seen = [], []
        with open(tmp_path / "out", "wb") as f:
            calls = store.part_fetches(f.fileno(), placed, progress=seen.append, on_done=done.append)
            assert len(calls) == len(placed)
            run_calls(calls[::-1], 3)
        assert (tmp_path / "out").read_bytes() == body
        assert sorted(done) == list(range(len(parts))) and sum(seen) == len(body)
        self.corrupt(store, parts[-1].digest, pieces[-1][:-1] + bytes([pieces[-1][-1] ^ 1]))
        with open(tmp_path / "out2", "wb") as f:
            calls = store.part_fetches(f.fileno(), placed)
            calls[0]()
            with pytest.raises(IntegrityError, match=f"blob {parts[-1].digest}"):
                calls[-1]()

    @pytest.mark.parametrize("evil", [b"tampered", None], ids=["other-size", "same-size"])
    def test_get_parts_detects_corruption(self, store, tmp_path, evil):
        src, pieces, parts = self._batch(tmp_path)
        store.put_parts(src, parts)
        self.corrupt(store, parts[0].digest, evil if evil is not None else pieces[0][:-1] + bytes([pieces[0][-1] ^ 1]))
        placed, offset = [], 0
        for part in parts:
            placed.append(Part(part.digest, offset, part.size))
            offset += part.size
        done = []
        with open(tmp_path / "out", "wb") as f, \
                pytest.raises(IntegrityError, match=f"blob {parts[0].digest}"):
            store.get_parts(f.fileno(), placed, on_done=done.append)
        assert 0 not in done

    # -- reading ---------------------------------------------------------------------------------
    def test_get_file_large_with_progress(self, store, tmp_path):
        data, digest = blob(os.urandom(self.big_size))
        store.put_bytes(data, digest)
        dest = tmp_path / "out.pt2"
        calls = []
        store.get_file(digest, dest, progress=calls.append)
        assert dest.read_bytes() == data
        assert sum(calls) == len(data)
        assert not list(Path(dest).parent.glob("*.incomplete"))

    @pytest.mark.parametrize("evil", [b"tampered", None], ids=["other-size", "same-size"])
    def test_get_file_detects_corruption_and_leaves_no_file(self, store, tmp_path, evil):
        data, digest = blob(os.urandom(self.big_size))
        store.put_bytes(data, digest)
        self.corrupt(store, digest, evil if evil is not None else data[:-1] + bytes([data[-1] ^ 1]))
        dest = tmp_path / "out.pt2"
        with pytest.raises(IntegrityError, match=f"blob {digest} is corrupt in the store"):
            store.get_file(digest, dest)
        assert not dest.exists()
        assert not list(Path(dest).parent.glob("*.incomplete"))

    def test_get_file_failure_keeps_an_existing_destination(self, store, tmp_path):
        data, digest = blob(b"genuine")
        store.put_bytes(data, digest)
        self.corrupt(store, digest, b"forged!")
        dest = tmp_path / "out"
        dest.write_bytes(b"previous")
        with pytest.raises(IntegrityError):
            store.get_file(digest, dest)
        assert dest.read_bytes() == b"previous"

    def test_read_bytes_verifies(self, store):
        data, digest = blob(b"small manifest")
        store.put_bytes(data, digest)
        self.corrupt(store, digest, b"large manifest")
        with pytest.raises(IntegrityError, match="corrupt"):
            store.read_bytes(digest, max_size=1000)

    def test_read_bytes_enforces_max_size(self, store):
        data, digest = blob(b"x" * 1000)
        store.put_bytes(data, digest)
        assert store.read_bytes(digest, max_size=1000) == data
        with pytest.raises(IntegrityError, match="larger than the limit of 999 bytes"):
            store.read_bytes(digest, max_size=999)

    def test_missing_blob(self, store, tmp_path):
        digest = blob(b"never stored")[1]
        assert store.exists(digest) is False
        for call in (lambda: store.stat(digest), lambda: store.open(digest),
                     lambda: store.read_bytes(digest, max_size=10),
                     lambda: store.get_file(digest, tmp_path / "out")):
            with pytest.raises(NotFoundError, match=digest) as info:
                call()
            assert info.value.what == "blob"
        assert not (tmp_path / "out").exists() and not list(tmp_path.glob("*.incomplete"))
        store.delete(digest)

    def test_delete(self, store):
        data, digest = blob(b"short-lived")
        store.put_bytes(data, digest)
        store.delete(digest)
        assert not store.exists(digest)
        assert self.raw_keys(store) == set()
        store.delete(digest)

    def test_list_yields_exactly_the_blobs(self, store):
        assert list(store.list()) == []
        stored = {blob(f"blob {i}".encode() * (i + 1)) for i in range(5)}
        for data, digest in stored:
            store.put_bytes(data, digest)
        self.add_junk(store)
        listed = list(store.list())
        assert all(isinstance(info, BlobInfo) and info.mtime > 0 for info in listed)
        assert {(i.digest, i.size) for i in listed} == {(d, len(b)) for b, d in stored}

    @pytest.mark.parametrize("digest", MALFORMED)
    def test_malformed_digest_is_a_usage_error(self, store, tmp_path, digest):
        src = tmp_path / "src"
        src.write_bytes(b"x")
        for call in (lambda: store.put_bytes(b"x", digest), lambda: store.put_file(src, digest),
                     lambda: store.put_stream(io.BytesIO(b"x"), digest),
                     lambda: store.exists(digest), lambda: store.stat(digest),
                     lambda: store.open(digest), lambda: store.read_bytes(digest, max_size=1),
                     lambda: store.get_file(digest, tmp_path / "out"),
                     lambda: store.delete(digest)):
            with pytest.raises(UsageError, match="invalid digest"):
                call()
        assert self.raw_keys(store) == set()


# -- the local backend -----------------------------------------------------------------------------

class TestLocalBlobStore(BlobStoreContract):
    @pytest.fixture
    def store(self, tmp_path) -> LocalBlobStore:
        return LocalBlobStore(tmp_path / "store")

    def raw_keys(self, store):
        return {p.relative_to(store.root).as_posix() for p in store.root.rglob("*")
                if p.is_file() and p.relative_to(store.root).parts[0] != "tmp"}

    def leftovers(self, store):
        tmp = store.root / "tmp"
        return sorted(p.name for p in tmp.iterdir()) if tmp.exists() else []

    def corrupt(self, store, digest, data):
        path = store.root / relpath(digest)
        path.chmod(0o644)
        path.write_bytes(data)

    def add_junk(self, store):
        (store.root / "tmp").mkdir(exist_ok=True)
        (store.root / "tmp" / "abandoned.tmp").write_bytes(b"partial")
        fan = store.root / "blobs" / "sha256" / "ab"
        fan.mkdir(parents=True, exist_ok=True)
        (fan / "notes.txt").write_bytes(b"not a blob")
        (fan / ("cd" + "0" * 62)).write_bytes(b"in the wrong fan directory")


class TestLocalSpecifics:
    def test_blob_files_are_read_only_and_tmp_is_emptied(self, tmp_path):
        store = LocalBlobStore(tmp_path)
        data, digest = blob(b"frozen")
        store.put_bytes(data, digest)
        mode = stat.S_IMODE((tmp_path / relpath(digest)).stat().st_mode)
        assert mode == 0o444
        assert list((tmp_path / "tmp").iterdir()) == []

    def test_partial_blob_is_never_visible(self, tmp_path):
        store = LocalBlobStore(tmp_path)
        data, digest = blob(os.urandom(3 * MiB))
        seen = []

        def look(n):
            seen.append((store.exists(digest), len(list((tmp_path / "tmp").iterdir()))))

        store.put_stream(io.BytesIO(data), digest, progress=look)
        assert len(seen) == 3 and set(seen) == {(False, 1)}
        assert store.exists(digest)

    def _packs_source(self, tmp_path):
        """A file of 40 small pieces back to back (after a 7-byte header) and two groups of them."""
        pieces = [os.urandom(100 + 37 * i) for i in range(40)]
        src = tmp_path / "src.bin"
        return src, pieces, ranges_file(src, pieces, b"header!")

    def test_put_packs_names_each_pack_by_its_bytes_and_claims_it_before_showing_it(self, tmp_path):
        """Each group becomes one blob named by the sha256 of its pieces one after the other
        (skipping a piece breaks the back-to-back run: two reads, one pack). The claim callback
        sees every pack written (temp files named by the tag) and none yet visible."""
        store = LocalBlobStore(tmp_path / "store")
        src, pieces, parts = self._packs_source(tmp_path)
        groups = [parts[:10] + parts[11:20], parts[20:]]
        whole = [parts[10]]
        seen = {}

        def claim(packs):
            seen["packs"] = list(packs)
            seen["visible"] = [d for d, _n in packs if store.exists(d)]
            seen["tmp"] = sorted(p.name.split(".", 1)[0] for p in (tmp_path / "store" / "tmp").iterdir())
        progress = []
        written, stored, packs = store.put_packs(src, whole, groups, tag="sha256:" + "7" * 64, claim=claim,
                                                 progress=progress.append)
        first, second = b"".join(pieces[:10] + pieces[11:20]), b"".join(pieces[20:])
        expected = [(blob(first)[1], len(first)), (blob(second)[1], len(second))]
        assert packs == seen["packs"] == expected
        assert seen["visible"] == [] and seen["tmp"].count("7" * 64) == 2
        assert (written, stored) == (sum(map(len, pieces)), 0) and sum(progress) == written
        for (digest, size), group in zip(packs, groups):
            assert store.read_bytes(digest, max_size=size) == b"".join(pieces[parts.index(p)] for p in group)
        assert store.read_bytes(whole[0].digest, max_size=1000) == pieces[10]
        assert list((tmp_path / "store" / "tmp").iterdir()) == []

    @pytest.mark.parametrize("fail", ["piece", "claim"])
    def test_put_packs_that_fails_leaves_no_pack_and_no_temp_file(self, tmp_path, fail):
        """A piece that does not match its digest (IntegrityError naming its offset), or a claim
        that fails: no pack is renamed into the store and every temp file is gone."""
        from registry.errors import ConflictError

        store = LocalBlobStore(tmp_path / "store")
        src, pieces, parts = self._packs_source(tmp_path)
        if fail == "piece":
            parts[25] = Part(blob(b"other bytes")[1], parts[25].offset, parts[25].size)

        def claim(packs):
            if fail == "claim":
                raise ConflictError("claim reaped")
        error = IntegrityError if fail == "piece" else ConflictError
        with pytest.raises(error, match=f"offset {parts[25].offset}" if fail == "piece" else "reaped"):
            store.put_packs(src, [], [parts[:20], parts[20:]], tag="sha256:" + "7" * 64, claim=claim)
        assert list(store.list()) == []
        assert list((tmp_path / "store" / "tmp").iterdir()) == []

    def _held_source(self, tmp_path, n=3):
        pieces = [os.urandom(MiB + 17 * i) for i in range(n)]
        src = tmp_path / "src.bin"
        return src, pieces, ranges_file(src, pieces)

    def test_put_parts_held_shows_nothing_before_the_claim_and_gc_spares_it(self, tmp_path, monkeypatch):
        """Copied before the caller's claim: while ``claimed`` has not returned, no blob is
        visible (each copy was made durable with a batch of one, and kept back), every copy
        lies in a locked ``tmp/held-*`` directory, and gc (no grace, no claims) leaves that
        directory alone; once it returns, every blob is stored and ``tmp/`` is empty."""
        import registry.blobs.local as local
        from tests.until import wait_until

        monkeypatch.setattr(local, "COMMIT_BLOBS", 1)   # a batch is due with every file
        committers = []
        init = local._Committer.__init__

        def recorded(self, *args, **kwargs):
            init(self, *args, **kwargs)
            committers.append(self)
        monkeypatch.setattr(local._Committer, "__init__", recorded)
        store = LocalBlobStore(tmp_path / "store")
        src, pieces, parts = self._held_source(tmp_path)
        digests = [p.digest for p in parts]
        seen = {}

        def claimed():
            tmp = tmp_path / "store" / "tmp"
            # every copy synced and kept back (or, were it not held, renamed in)
            wait_until(lambda: len(committers[0]._synced_held) == len(parts) or any(map(store.exists, digests)),
                       "the copies synced")
            seen["visible"] = [p.digest for p in parts if store.exists(p.digest)]
            seen["held"] = sorted(f.name.split(".", 1)[0] for d in tmp.iterdir() for f in d.iterdir())
            seen["gc"] = store.abort_stale_uploads(0)
            seen["after gc"] = sorted(f.name.split(".", 1)[0] for d in tmp.iterdir() for f in d.iterdir())
        progress = []
        written, stored = store.put_parts_held(src, parts, claimed=claimed, progress=progress.append)
        assert seen["visible"] == [] and seen["gc"] == []
        assert seen["held"] == seen["after gc"] == sorted(p.digest[7:] for p in parts)
        assert (written, stored) == (sum(map(len, pieces)), 0) and sum(progress) == written
        for part, piece in zip(parts, pieces):
            assert store.read_bytes(part.digest, max_size=part.size) == piece
        assert list((tmp_path / "store" / "tmp").iterdir()) == []

    def test_put_parts_held_without_a_claim_keeps_nothing(self, tmp_path):
        from concurrent.futures import CancelledError

        store = LocalBlobStore(tmp_path / "store")
        src, _pieces, parts = self._held_source(tmp_path)

        def claimed():
            raise CancelledError("the push claimed nothing")
        with pytest.raises(CancelledError):
            store.put_parts_held(src, parts, claimed=claimed)
        assert list(store.list()) == []
        assert list((tmp_path / "store" / "tmp").iterdir()) == []

    def test_put_parts_held_writes_again_a_blob_deleted_before_the_claim(self, tmp_path):
        """A blob found stored is not copied; gc deleting it before the claim (it was nobody's
        yet) makes the put write it after the claim, counted as written."""
        store = LocalBlobStore(tmp_path / "store")
        src, pieces, parts = self._held_source(tmp_path)
        store.put_bytes(pieces[1], parts[1].digest)

        def claimed():
            store.delete(parts[1].digest)
        written, stored = store.put_parts_held(src, parts, claimed=claimed)
        assert (written, stored) == (sum(map(len, pieces)), 0)
        assert store.read_bytes(parts[1].digest, max_size=parts[1].size) == pieces[1]

    def test_gc_removes_a_held_directory_once_its_writer_is_dead(self, tmp_path):
        """A writer killed (SIGKILL) while it held copies it had not claimed: its lock died
        with it, so gc removes the copies and the directory; a directory still being made
        (``.held-*``, not yet locked) is spared for a minute, then removed too."""
        store_dir = tmp_path / "store"
        digest = blob(b"never claimed")[1]
        code = ("import os, signal, sys\n"
                "from registry.blobs import LocalBlobStore\n"
                "with LocalBlobStore(sys.argv[1])._held_dir() as d:\n"
                "    (d / (sys.argv[2] + '.x.tmp')).write_bytes(b'half')\n"
                "    os.kill(os.getpid(), signal.SIGKILL)\n")
        done = subprocess.run([sys.executable, "-c", code, str(store_dir), digest[7:]])
        assert done.returncode == -9
        tmp = store_dir / "tmp"
        (held,) = tmp.iterdir()
        assert held.name.startswith("held-") and len(list(held.iterdir())) == 1
        young, old = tmp / ".held-0123456789abcdef", tmp / ".held-fedcba9876543210"
        young.mkdir()
        old.mkdir()
        os.utime(old, (time.time() - 120, time.time() - 120))
        store = LocalBlobStore(store_dir)
        assert store.abort_stale_uploads(3600) == []               # its copy is too young to judge
        assert store.abort_stale_uploads(0, dry_run=True) == [digest]
        assert held.exists()
        assert store.abort_stale_uploads(0) == [digest]
        assert sorted(p.name for p in tmp.iterdir()) == [young.name]

    def test_held_files_are_synced_with_their_batch_but_renamed_only_once_released(self, tmp_path, monkeypatch):
        """The committer makes a held file durable with the batch it came in (its sync overlaps
        the copies still running) and renames it only after ``release``; one never released is
        removed by ``finish``, and ``abort`` removes held files too."""
        import registry.blobs.local as local

        monkeypatch.setattr(local, "COMMIT_BYTES", 1)          # a sync after every byte written
        syncs = []
        real_sync = local.sync_filesystem
        monkeypatch.setattr(local, "sync_filesystem", lambda root: (syncs.append(root), real_sync(root)))
        store = LocalBlobStore(tmp_path / "store")
        (tmp_path / "store" / "tmp").mkdir(parents=True)

        def temp(data: bytes) -> tuple[str, Part]:
            path = tmp_path / "store" / "tmp" / f"{blob(data)[1][7:]}.x.tmp"
            path.write_bytes(data)
            return str(path), Part(blob(data)[1], 0, len(data))
        for release in (True, False):
            committer = local._Committer(store)
            held, plain = temp(b"held %d" % release), temp(b"plain %d" % release)
            committer.add(*held, held=True)
            committer.add(*plain)
            committer.counting(None)(1)                           # a byte written: a sync is due
            for _ in range(3000):   # syncfs flushes the whole filesystem: slow on a busy disk
                if store.exists(plain[1].digest):
                    break
                time.sleep(0.01)
            assert store.exists(plain[1].digest) and not store.exists(held[1].digest)
            # added before ``plain``, so in its batch or an earlier one: synced, not renamed
            assert Path(held[0]).exists() and syncs
            if release:
                committer.release()
            committer.finish()
            assert store.exists(held[1].digest) == release and not Path(held[0]).exists()
        committer = local._Committer(store)
        held = temp(b"held, then aborted")
        committer.add(*held, held=True)
        committer.abort()
        assert not store.exists(held[1].digest) and not Path(held[0]).exists()

    def test_put_parts_syncs_as_bytes_are_written_not_only_when_files_finish(self, tmp_path, monkeypatch):
        """A sync is due every ``COMMIT_BYTES`` written, so the disk flushes while a large blob
        is still being copied (the last sync finds little left); the blob is renamed in only
        after a sync that began once it was complete."""
        import registry.blobs.local as local

        monkeypatch.setattr(local, "COMMIT_BYTES", 4 * MiB)
        done = [0]
        at_sync = []
        real_sync = local.sync_filesystem
        store = LocalBlobStore(tmp_path / "store")
        data = os.urandom(24 * MiB)
        mid_copy = threading.Event()

        def sync(root):
            at_sync.append(done[0])
            shown.append(store.exists(blob(data)[1]))
            real_sync(root)
            if done[0] < len(data):
                mid_copy.set()

        monkeypatch.setattr(local, "sync_filesystem", sync)
        shown = []
        src = tmp_path / "src.bin"
        src.write_bytes(data)

        def progress(n):   # told after the committer counted the bytes
            done[0] += n
            if local.COMMIT_BYTES <= done[0] < len(data):
                mid_copy.wait(30)   # a slow copy: the committer syncs before it goes on
        store.put_parts(src, [Part(blob(data)[1], 0, len(data))], progress=progress)
        assert any(n < len(data) for n in at_sync), at_sync   # a sync began before the copy ended
        assert at_sync[-1] == len(data)
        assert not any(shown[:-1])    # not visible before a sync that began once it was complete
        assert store.read_bytes(blob(data)[1], max_size=len(data)) == data

    def test_constructor_does_no_io(self, tmp_path):
        LocalBlobStore(tmp_path / "not-yet")
        assert not (tmp_path / "not-yet").exists()

    def test_failing_progress_callback_leaves_nothing(self, tmp_path):
        store = LocalBlobStore(tmp_path)
        data, digest = blob(b"abc")

        def explode(n):
            raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            store.put_stream(io.BytesIO(data), digest, progress=explode)
        assert not store.exists(digest) and list((tmp_path / "tmp").iterdir()) == []

    def test_stat_mtime_is_the_file_mtime(self, tmp_path):
        store = LocalBlobStore(tmp_path)
        data, digest = blob(b"t")
        store.put_bytes(data, digest)
        assert store.stat(digest) == BlobInfo(digest, 1, (tmp_path / relpath(digest)).stat().st_mtime)


class TestOpenBlobStore:
    def test_file_url(self, tmp_path):
        store = open_blob_store(tmp_path.as_uri())
        assert isinstance(store, LocalBlobStore) and store.root == tmp_path
        assert store.url == tmp_path.as_uri()

    def test_file_url_with_escapes_and_localhost(self, tmp_path):
        root = tmp_path / "with space"
        assert open_blob_store(root.as_uri()).root == root
        assert open_blob_store(f"file://localhost{tmp_path}").root == tmp_path

    def test_plain_paths(self, tmp_path, monkeypatch):
        assert open_blob_store(str(tmp_path)).root == tmp_path
        monkeypatch.chdir(tmp_path)
        assert open_blob_store("rel/dir").root == tmp_path / "rel" / "dir"

    def test_s3_url(self):
        store = open_blob_store("s3://models/team-a/")
        assert type(store).__name__ == "S3BlobStore"
        assert (store.bucket, store.prefix, store.url) == ("models", "team-a", "s3://models/team-a")

    @pytest.mark.parametrize("url", ["", "gs://bucket/x", "http://host/x", "file://otherhost/x",
                                     "s3://", "s3://a", "s3://Bad_Bucket!/x", "s3://bucket/x?y=1"])
    def test_bad_urls_are_usage_errors(self, url):
        with pytest.raises(UsageError) as info:
            open_blob_store(url)
        assert "\n" not in str(info.value)

    def test_importing_blobs_does_not_import_boto3(self):
        code = ("import sys, registry.blobs as b; b.open_blob_store('/tmp/x'); "
                "assert 'boto3' not in sys.modules and 'botocore' not in sys.modules")
        subprocess.run([sys.executable, "-c", code], check=True,
                       cwd=Path(__file__).resolve().parents[2])
