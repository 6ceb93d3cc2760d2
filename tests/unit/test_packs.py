"""Pack indexes (``format.packs``) and reading chunks out of packs (``blobs.packed``): the index
is parsed as hostile input, it may only place the manifest's own chunks, and every chunk read
from a pack is checked against its own digest before it is written."""
from __future__ import annotations

import hashlib
import itertools
import json
import os

import pytest

from registry.blobs.local import LocalBlobStore
from registry.blobs.packed import PackedPart, check_packed, get_packed, runs
from registry.errors import IntegrityError, NotFoundError, UsageError
from registry.format.manifest import stored_blobs
from registry.format.packs import ChunkLocation, Pack, PackEntry, PackIndex, stored_with_packs


def d(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


CHUNKS = [os.urandom(n) for n in (100, 3000, 1, 7_000, 512)]
PACK = b"".join(CHUNKS)


def _index() -> PackIndex:
    entries, at = [], 0
    for c in CHUNKS:
        entries.append(PackEntry(d(c), at, len(c)))
        at += len(c)
    return PackIndex((Pack.of(d(PACK), len(PACK), entries),))


def test_index_round_trips_through_canonical_json():
    index = _index()
    text = index.to_json()
    assert PackIndex.from_json(text) == index
    assert json.loads(text)["packs"][0]["chunks"][1] == [d(CHUNKS[1])[7:], 100, 3000]
    assert PackIndex.from_json(None) == PackIndex() and not PackIndex.from_json("")
    loc = index.locations()[d(CHUNKS[3])]
    assert loc == ChunkLocation(d(PACK), len(PACK), 3101, 7_000)
    assert PackIndex.from_locations(index.locations()) == index


def _raw(**edit) -> str:
    raw = json.loads(_index().to_json())
    pack = raw["packs"][0]
    for key, value in edit.items():
        if key == "chunk1":
            pack["chunks"][1] = value
        else:
            pack[key] = value
    return json.dumps(raw)


@pytest.mark.parametrize("text, problem", [
    ("[]", "not an object"),
    ("{not json", "not JSON"),
    ("[" * 200_000, "not JSON"),                                                  # nested past the recursion limit
    ('{"packs": [], "extra": 1}', "not an object"),
    (_raw(size=0), "not an integer >= 1"),
    (_raw(size=True), "not an integer"),
    (_raw(digest="sha256:" + "G" * 64), "is not sha256"),
    (_raw(chunk1=["ab" * 32, 100]), "is not \\[sha256 hex, offset, size\\]"),
    (_raw(chunk1=["AB" * 32, 100, 3000]), "not 64 lowercase hex"),
    (_raw(chunk1=["ab" * 32, -1, 3000]), "offset is -1"),
    (_raw(chunk1=["ab" * 32, 100, 0]), "size is 0"),
    (_raw(chunk1=["ab" * 32, len(PACK) - 10, 3000]), "past the pack's"),      # outside the pack
    (_raw(chunk1=["ab" * 32, 50, 3000]), "overlap"),                            # over chunk 0
    (_raw(chunk1=[d(CHUNKS[0])[7:], 100, 3000]), "listed twice"),
    (_raw(chunk1=["ab" * 32, 100, 65536]), "only chunks under 65536 bytes are packed"),
    (_raw(size=(64 << 20) + 1), "67108864 bytes at most"),
    (_raw(chunks=[]), "1 chunk or more"),
    (_raw(chunk1=["ab" * 31 + "a ", 100, 3000]), "not 64 lowercase hex"),       # whitespace in the hex
    (_raw(chunk1=["ab" * 31 + "\u0663\u0663", 100, 3000]), "not 64 lowercase hex"),  # non-ASCII digits
    (_raw(chunk1=["ab" * 32, True, 3000]), "offset is True"),                  # bool is no int
    (_raw(chunk1=["ab" * 32, 100, 3000.0]), "size is 3000.0"),
    (_raw(chunk1={"a": 1, "b": 2, "c": 3}), "is not \\[sha256 hex, offset, size\\]"),  # three keys, not a list
    (_raw(chunk1="abc"), "is not \\[sha256 hex, offset, size\\]"),         # three characters
    # integers past 64 bits (orjson reads them as floats: the standard library's verdict stands)
    (_raw(chunk1=["ab" * 32, 2 ** 70, 3000]), "ends at byte 1180591620717411306424, past the pack's"),
    (_raw(size=2 ** 64), "18446744073709551616 bytes and 5 chunks"),
])
def test_a_malformed_index_is_refused_with_the_problem_named(text, problem):
    with pytest.raises(UsageError, match=problem):
        PackIndex.from_json(text)


def test_a_chunk_in_two_packs_is_refused():
    """The quick path checks each pack on its own; a chunk repeated in a later pack is caught
    across packs (and the message comes from the one-by-one walk)."""
    raw = json.loads(_index().to_json())
    other = {"digest": "sha256:" + "cd" * 32, "size": 10, "chunks": [[d(CHUNKS[2])[7:], 0, 1]]}
    with pytest.raises(UsageError, match=f"chunk {d(CHUNKS[2])} is listed twice"):
        PackIndex.from_json(json.dumps({"packs": [raw["packs"][0], other]}))
    with pytest.raises(UsageError, match=f"chunk {d(CHUNKS[2])} is listed twice"):
        PackIndex.from_json(json.dumps({"packs": [other, raw["packs"][0]]}))


def test_a_large_index_parses_by_whole_list_checks_to_the_same_entries():
    """10,000 entries out of order, the shape a 10,000-tensor program records: parsed into
    entries sorted by offset, and each one-entry change that breaks a rule is refused."""
    rng = __import__("random").Random(7)
    sizes = [rng.randrange(1, 4096) for _ in range(10_000)]
    offsets: list[int] = []
    at = 0
    for n in sizes:
        offsets.append(at)
        at += n
    chunks = [[hashlib.sha256(str(i).encode()).hexdigest(), offsets[i], sizes[i]] for i in range(len(sizes))]
    shuffled = chunks[:]
    rng.shuffle(shuffled)
    text = json.dumps({"packs": [{"digest": "sha256:" + "ef" * 32, "size": at, "chunks": shuffled}]})
    index = PackIndex.from_json(text)
    assert [(e.chunk[7:], e.offset, e.size) for e in index.packs[0].entries] == [tuple(c) for c in chunks]
    for k, bad in [(5000, [chunks[5000][0], chunks[5000][1] - 1, chunks[5000][2]]),      # overlaps its neighbour
                   (9999, [chunks[9999][0], at, 1]),                                     # past the end
                   (1, [chunks[0][0], chunks[1][1], chunks[1][2]])]:                     # chunk 0 twice
        edited = [bad if c is chunks[k] else c for c in shuffled]
        with pytest.raises(UsageError):
            PackIndex.from_json(json.dumps({"packs": [{"digest": "sha256:" + "ef" * 32, "size": at,
                                                       "chunks": edited}]}))


def test_two_packs_with_one_digest_are_refused():
    raw = json.loads(_index().to_json())
    twin = {**raw["packs"][0], "chunks": [["cd" * 32, 0, 10]]}
    with pytest.raises(UsageError, match="a pack is listed twice"):
        PackIndex.from_json(json.dumps({"packs": [raw["packs"][0], twin]}))


def test_stored_blobs_replace_packed_chunks_by_their_pack():
    needed = {(d(c), len(c)) for c in CHUNKS} | {("sha256:" + "ee" * 32, 5 << 20)}
    stored = stored_with_packs(needed, _index())
    assert stored == {(d(PACK), len(PACK)), ("sha256:" + "ee" * 32, 5 << 20)}
    # an index may only say where the manifest's own chunks are, at their size
    with pytest.raises(UsageError, match="not one the manifest names"):
        stored_with_packs(needed - {(d(CHUNKS[2]), 1)}, _index())
    with pytest.raises(UsageError, match="not one the manifest names"):
        stored_with_packs((needed - {(d(CHUNKS[2]), 1)}) | {(d(CHUNKS[2]), 2)}, _index())


def test_a_whole_member_equal_to_a_packed_chunk_stays_a_blob():
    """A sample member whose bytes equal a packed chunk is still fetched as one blob: it must
    stay among the version's blobs (else nothing uploads or keeps it)."""
    member = {"path": "programs/m.pt2", "size": len(PACK), "role": "program",
              "chunks": [{"sha256": d(c)[7:], "size": len(c)} for c in CHUNKS]}
    sample = {"path": "samples/s.pt", "size": 100, "role": "sample", "sha256": d(CHUNKS[0])[7:]}
    stored = stored_blobs(json.dumps({"members": [member, sample]}), _index())
    assert (d(CHUNKS[0]), 100) in stored and (d(PACK), len(PACK)) in stored
    assert (d(CHUNKS[1]), 3000) not in stored


def test_manifest_stored_blobs_with_an_index():
    member = {"path": "programs/m.pt2", "size": len(PACK) + 5, "role": "program",
              "chunks": [{"sha256": d(c)[7:], "size": len(c)} for c in CHUNKS] + [{"sha256": "ee" * 32, "size": 5}]}
    text = json.dumps({"members": [member]})
    plain = stored_blobs(text)
    assert (d(CHUNKS[0]), 100) in plain
    packed = stored_blobs(text, _index().to_json())
    assert (d(PACK), len(PACK)) in packed and (d(CHUNKS[0]), 100) not in packed
    assert ("sha256:" + "ee" * 32, 5) in packed
    with pytest.raises(IntegrityError, match="pack index does not fit"):
        stored_blobs(json.dumps({"members": []}), _index().to_json())


def test_runs_coalesce_neighbours_of_one_pack_and_stay_bounded():
    P = lambda pack, at, n=10: PackedPart("sha256:" + "0" * 64, 0, n, pack, at)  # noqa: E731
    parts = [P("b", 0), P("a", 10), P("a", 0), P("a", 5000), P("a", 20)]
    assert runs(parts, gap=100) == [[2, 1, 4], [3], [0]]
    assert runs(parts, gap=10_000) == [[2, 1, 4, 3], [0]]
    # no run longer than max_bytes, whatever the gap
    big = [P("a", i * 100, 100) for i in range(50)]
    assert all(len(r) <= 10 for r in runs(big, max_bytes=1000))
    assert sorted(i for r in runs(big, max_bytes=1000) for i in r) == list(range(50))
    # the same chunk twice (a member repeating a tensor) is read once per run, written twice
    assert runs([P("a", 0), P("a", 0)]) == [[0, 1]]


@pytest.fixture
def store(tmp_path):
    s = LocalBlobStore(tmp_path / "store")
    s.put_bytes(PACK, d(PACK))
    return s


def _parts(dest_gap: int = 0) -> list[PackedPart]:
    out, at, dest = [], 0, 0
    for c in CHUNKS:
        out.append(PackedPart(d(c), dest, len(c), d(PACK), at))
        at += len(c)
        dest += len(c) + dest_gap
    return out


@pytest.mark.parametrize("dest_gap", [0, 7])
def test_get_packed_writes_every_chunk_in_place(tmp_path, store, dest_gap):
    parts = _parts(dest_gap)
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT)
    done, seen = [], []
    try:
        get_packed(store, fd, parts, progress=seen.append, on_done=done.append)
    finally:
        os.close(fd)
    out = (tmp_path / "out").read_bytes()
    for p, c in zip(parts, CHUNKS):
        assert out[p.offset:p.offset + p.size] == c
    assert sorted(done) == list(range(len(parts))) and sum(seen) == len(PACK)


def test_a_corrupt_pack_fails_the_chunk_it_damaged(tmp_path, store):
    path = store._path(d(PACK))
    os.chmod(path, 0o644)
    raw = bytearray(path.read_bytes())
    raw[100 + 3000 + 1 + 10] ^= 0xFF          # inside chunk 3
    path.write_bytes(bytes(raw))
    fd = os.open(tmp_path / "out", os.O_RDWR | os.O_CREAT)
    try:
        with pytest.raises(IntegrityError, match=f"chunk {d(CHUNKS[3])} read from pack {d(PACK)} at offset 3101"):
            get_packed(store, fd, _parts())
    finally:
        os.close(fd)
    with pytest.raises(IntegrityError, match="does not match its digest"):
        check_packed(store, _parts()[3:4])
    check_packed(store, _parts()[:3])     # the chunks before it are intact


def test_an_index_pointing_a_chunk_elsewhere_is_caught(store):
    lying = [PackedPart(d(CHUNKS[1]), 0, 3000, d(PACK), 0)]    # chunk 1 is not at offset 0
    with pytest.raises(IntegrityError, match="does not match its digest"):
        check_packed(store, lying)
    with pytest.raises(IntegrityError, match="too short"):
        check_packed(store, [PackedPart(d(CHUNKS[1]), 0, 3000, d(PACK), len(PACK) - 10)])
    with pytest.raises(NotFoundError):
        check_packed(store, [PackedPart(d(CHUNKS[1]), 0, 3000, "sha256:" + "ab" * 32, 0)])


class _Pieces:
    """A store whose ``read_range_into`` hands ``data``'s range over in the given piece sizes,
    through one reused buffer (as the local store does), recording each read."""

    read_workers = 8   # declared, as every BlobStore does

    def __init__(self, data: bytes, sizes) -> None:
        self.data, self.sizes, self.reads = data, sizes, []

    def read_range_into(self, digest, offset, length, out):
        self.reads.append((offset, length))
        buf, at, sizes = bytearray(max(self.sizes)), offset, itertools.cycle(self.sizes)
        while at < offset + length:
            n = min(next(sizes), offset + length - at)
            buf[:n] = self.data[at:at + n]
            out.write(memoryview(buf)[:n])
            buf[:n] = b"\xee" * n          # a writer that kept the view would see this
            at += n


def _random_run(rng, count: int = 60, back_to_back: bool = False):
    """A pack of ``count`` chunks under 64 KiB with gaps between some, a run over some of them
    (some twice: a tensor a member repeats) and where each lands in the member. ``back_to_back``:
    a pull's usual run instead, every chunk in pack order, back to back in the pack and in the
    member but for a few breaks (``_RunWriter`` takes such stretches at once)."""
    from registry.blobs.packed import PackRun

    def gap(choices: list[int]) -> int:
        return (5 if rng.random() < 0.07 else 0) if back_to_back else rng.choice(choices)

    pack, chunks = bytearray(), []
    for tag in range(count):  # noqa: B007
        pack += rng.randbytes(gap([0, 0, 0, 5, 4000]))         # a gap (another member's chunk)
        size = rng.choice([1, 17, 700, 9000, 65_535])
        at = len(pack)
        pack += rng.randbytes(size)
        chunks.append((hashlib.sha256(pack[at:]).hexdigest(), at, size))
    picked = chunks if back_to_back else sorted(rng.sample(chunks, count // 2) + rng.sample(chunks, 3),
                                                key=lambda c: c[1])
    dest, run = 0, []
    for tag, (hex_, at, size) in enumerate(picked):
        dest += gap([0, 0, 3])
        run.append((hex_, at, size, dest, tag))
        dest += size
    start, end = run[0][1], max(c[1] + c[2] for c in run)
    return bytes(pack), PackRun(d(bytes(pack)), start, end, run), dest


@pytest.mark.parametrize("back_to_back", [False, True], ids=["scattered", "back-to-back"])
@pytest.mark.parametrize("seed", range(40))
def test_a_run_in_pieces_of_any_size_writes_each_chunk_once_in_place(tmp_path, seed, back_to_back):
    """``read_runs`` takes a run's bytes in whatever pieces the store sends (a chunk cut by a
    piece boundary, a piece of one byte, the whole run at once): every chunk is written at its
    place, exactly its bytes, reported done once, and progress adds up to what was written."""
    import random

    from registry.blobs.packed import read_runs

    rng = random.Random(seed)
    pack, run, size = _random_run(rng, back_to_back=back_to_back)
    sizes = rng.choice([[1, 2, 3, 5000], [700], [65_536], [1 << 20], [rng.randint(1, 100_000) for _ in range(50)]])
    store = _Pieces(pack, sizes)
    path = tmp_path / "out"
    path.write_bytes(b"\0" * size)
    fd = os.open(path, os.O_RDWR)
    done, seen = [], []
    try:
        read_runs(store, fd, [run], progress=seen.append, on_done=done.append)
    finally:
        os.close(fd)
    out = path.read_bytes()
    for hex_, at, n, dest, _tag in run.chunks:  # noqa: B007
        assert out[dest:dest + n] == pack[at:at + n]
    assert sorted(done) == list(range(len(run.chunks)))
    assert sum(seen) == sum(c[2] for c in run.chunks)
    assert store.reads == [(run.start, run.end - run.start)]      # one ranged read per run


@pytest.mark.parametrize("piece", [1, 7, 300, 512, 1000, 4096])
def test_a_chunk_inside_another_is_read_from_what_was_kept(tmp_path, piece):
    """An index never lays one chunk inside another (``PackIndex`` refuses overlaps), but
    ``get_packed`` takes any parts: a chunk lying inside one cut by a piece boundary is only
    complete once that one is, and is then taken from the kept bytes."""
    import random

    from registry.blobs.packed import PackRun, read_runs

    pack = random.Random(3).randbytes(3000)
    h = lambda a, n: hashlib.sha256(pack[a:a + n]).hexdigest()       # noqa: E731
    spans = [(0, 1000), (100, 100), (250, 2000), (900, 50), (999, 1), (2200, 800)]
    chunks, dest = [], 0
    for tag, (at, n) in enumerate(spans):
        chunks.append((h(at, n), at, n, dest, tag))
        dest += n
    path = tmp_path / "out"
    path.write_bytes(b"\0" * dest)
    fd = os.open(path, os.O_RDWR)
    done = []
    try:
        read_runs(_Pieces(pack, [piece]), fd, [PackRun(d(pack), 0, 3000, chunks)], on_done=done.append)
    finally:
        os.close(fd)
    out = path.read_bytes()
    assert [out[c[3]:c[3] + c[2]] for c in chunks] == [pack[at:at + n] for at, n in spans]
    assert sorted(done) == list(range(len(spans)))


@pytest.mark.parametrize("back_to_back", [False, True], ids=["scattered", "back-to-back"])
@pytest.mark.parametrize("piece", [1, 1000, 1 << 20])
def test_a_bad_chunk_in_a_run_stops_it_before_it_is_written(tmp_path, piece, back_to_back):
    """The chunk that does not match raises; neither it nor any chunk after it is written (those
    before it may be: the file is discarded); ``checked`` hears of each chunk up to it."""
    import random

    from registry.blobs.packed import read_run

    pack, run, size = _random_run(random.Random(99), back_to_back=back_to_back)
    bad = next(i for i in range(20, len(run.chunks)) if run.chunks[i][1] != run.chunks[i - 1][1])  # not a repeat
    hex_, at, n, dest, tag = run.chunks[bad]
    broken = bytearray(pack)
    broken[at + n // 2] ^= 0x01
    path = tmp_path / "out"
    path.write_bytes(b"\0" * size)
    fd = os.open(path, os.O_RDWR)
    try:
        with pytest.raises(IntegrityError, match=f"chunk sha256:{hex_} read from pack .* at offset {at} "):
            read_run(_Pieces(bytes(broken), [piece]), run, fd)
    finally:
        os.close(fd)
    out = path.read_bytes()
    for c in run.chunks[bad:]:
        assert out[c[3]:c[3] + c[2]] == b"\0" * c[2]
    seen = []
    with pytest.raises(IntegrityError):
        read_run(_Pieces(bytes(broken), [piece]), run, None, checked=lambda t, ok: seen.append((t, ok)))
    assert seen == [(c[4], True) for c in run.chunks[:bad]] + [(tag, False)]


def test_a_store_that_sends_less_than_the_run_is_refused(tmp_path):
    """A store that ends early without an error (it must not): the chunks not sent are named."""
    import random

    from registry.blobs.packed import read_run

    pack, run, _ = _random_run(random.Random(5))

    class Short(_Pieces):
        def read_range_into(self, digest, offset, length, out):
            super().read_range_into(digest, offset, length - 10, out)

    with pytest.raises(IntegrityError, match="was not in the bytes the store sent"):
        read_run(Short(pack, [4096]), run, None)


def test_a_server_older_than_packs_means_no_packs(tmp_path):
    """Its answer to the unknown route is a 404 "no such route": the push then stores every
    chunk as a blob of its own (an older server refuses pack digests at publish)."""
    from types import SimpleNamespace

    from registry.client.upload import plan_upload
    from registry.format.manifest import Member
    from registry.remote.meta import HttpMetadataStore

    def post_json(path, body):
        raise NotFoundError(f"no such route: POST {path}", what="route")

    meta = HttpMetadataStore(SimpleNamespace(post_json=post_json, base_url="http://old"))
    assert meta.locate_chunks(["sha256:" + "ab" * 32], name="m") is None
    path = tmp_path / "b.pt2b"
    path.write_bytes(PACK)
    member = Member("programs/m.pt2", None, len(PACK), "program", tuple((d(c)[7:], len(c)) for c in CHUNKS))
    bundle = SimpleNamespace(path=path, manifest=SimpleNamespace(members=[member]),
                             member_span=lambda _p: (0, len(PACK)))
    plan = plan_upload(bundle, meta, LocalBlobStore(tmp_path / "store"), "m")
    assert not plan.index and not plan.packs and {p.digest for p in plan.whole} == {d(c) for c in CHUNKS}
    # any store that declares it keeps no packs (locate_chunks answers None) is the same
    no_packs = SimpleNamespace(locate_chunks=lambda digests, *, name: None)
    assert not plan_upload(bundle, no_packs, LocalBlobStore(tmp_path / "store"), "m").index

    def missing_model(path, body):
        raise NotFoundError("model 'm' not found", what="model")

    with pytest.raises(NotFoundError, match="model 'm'"):      # any other 404 is an error
        HttpMetadataStore(SimpleNamespace(post_json=missing_model, base_url="x")).locate_chunks(["sha256:" + "ab" * 32],
                                                                                              name="m")


def test_the_servers_memory_of_checked_entries_is_bounded_and_forgets_failures(monkeypatch):
    """``PackChecks``: a matched entry is remembered (least recently used forgotten first past
    the limit); a failed one is refused for ``BAD_SECONDS``, then read again."""
    from registry.server import state

    checks = state.PackChecks(limit=3)
    keys = [checks.key("sha256:" + "a" * 64, "sha256:" + "b" * 64, i, 10) for i in range(5)]
    assert len(set(keys)) == 5 and all(checks.verdict(k) is None for k in keys)
    for k in keys[:3]:
        checks.record(k, True)
    assert checks.verdict(keys[0]) is True          # used: now the most recent
    checks.record(keys[3], True)                    # over the limit: keys[1] goes
    assert [checks.verdict(k) for k in keys[:4]] == [True, None, True, True]
    now = [1000.0]
    monkeypatch.setattr(state.time, "monotonic", lambda: now[0])
    checks.record(keys[4], False)
    assert checks.verdict(keys[4]) is False
    now[0] += state.PackChecks.BAD_SECONDS + 1
    assert checks.verdict(keys[4]) is None          # the pack may have been mended since
    checks.record(keys[4], True)
    assert checks.verdict(keys[4]) is True


def test_a_pack_with_no_entries_has_no_locations():
    index = PackIndex((Pack.of("sha256:" + "b" * 64, 1, ()), *_index().packs))
    assert index.locations() == _index().locations()
