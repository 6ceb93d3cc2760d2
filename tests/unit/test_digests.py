"""The one hash-while-streaming loop (``pump``) and the adapters built on it."""
from __future__ import annotations

import hashlib
import io
import os
from types import SimpleNamespace

import pytest

from registry.digests import HashingWriter, VerifyingReader, pump, sha256_stream
from registry.errors import IntegrityError
from registry.store.engine import GC_LOCK_KEY, advisory_lock

DATA = os.urandom(3 * 1024 * 1024 + 17)  # several CHUNK_SIZE pieces and a short last one


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def test_pump_feeds_every_sink_in_order_and_reports_progress():
    h, out, seen = hashlib.sha256(), io.BytesIO(), []
    assert pump(io.BytesIO(DATA), h.update, out.write, progress=seen.append) == len(DATA)
    assert out.getvalue() == DATA and h.digest() == hashlib.sha256(DATA).digest()
    assert sum(seen) == len(DATA) and max(seen) == 1024 * 1024


def test_pump_stops_at_size_and_counts_a_short_stream():
    src = io.BytesIO(DATA)
    assert pump(src, size=100) == 100 and src.tell() == 100
    assert pump(io.BytesIO(b"abc"), size=10) == 3


def test_sha256_stream_hashes_and_copies_in_one_pass():
    out = io.BytesIO()
    assert sha256_stream(io.BytesIO(DATA), out=out) == (hashlib.sha256(DATA).hexdigest(), len(DATA))
    assert out.getvalue() == DATA
    assert sha256_stream(io.BytesIO(DATA), 10) == (hashlib.sha256(DATA[:10]).hexdigest(), 10)


def test_verifying_reader_raises_on_the_read_that_completes_wrong_content():
    seen = []
    reader = VerifyingReader(io.BytesIO(DATA), _digest(DATA), size=len(DATA), progress=seen.append)
    assert pump(reader) == len(DATA) and sum(seen) == len(DATA)
    with pytest.raises(IntegrityError, match="does not match its digest"):
        pump(VerifyingReader(io.BytesIO(DATA), _digest(b"other"), size=len(DATA)))
    with pytest.raises(IntegrityError, match="member 'x' is wrong: got"):
        pump(VerifyingReader(io.BytesIO(DATA), _digest(b"other"),
                             mismatch=lambda got: IntegrityError(f"member 'x' is wrong: got {got}")))
    with pytest.raises(IntegrityError, match="ended after 5 of 10 bytes"):
        pump(VerifyingReader(io.BytesIO(b"12345"), _digest(b"1234567890"), size=10))


def test_hashing_writer():
    src = io.BytesIO(DATA)
    src.seek(100)
    writer = HashingWriter(io.BytesIO())
    assert pump(src, writer.write, size=1000) == 1000
    assert writer.hexdigest() == hashlib.sha256(DATA[100:1100]).hexdigest() and writer.count == 1000


def test_advisory_lock_is_postgresql_only():
    calls = []

    def session(dialect: str) -> SimpleNamespace:
        bind = SimpleNamespace(dialect=SimpleNamespace(name=dialect))
        return SimpleNamespace(get_bind=lambda: bind, execute=lambda sql, params: calls.append((str(sql), params)))

    advisory_lock(session("sqlite"), GC_LOCK_KEY)
    assert calls == []
    advisory_lock(session("postgresql"), GC_LOCK_KEY)
    advisory_lock(session("postgresql"), GC_LOCK_KEY, shared=True)
    assert calls == [("SELECT pg_advisory_xact_lock(:key)", {"key": GC_LOCK_KEY}),
                     ("SELECT pg_advisory_xact_lock_shared(:key)", {"key": GC_LOCK_KEY})]
