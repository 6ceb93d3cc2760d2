"""A cold ``registry.load`` from a local store on this machine uses the weights where they lie
(``blobs.inplace``): each weight chunk is hashed in its store file and torch maps it from
there, a split tensor's pieces side by side, so nothing is copied into the client cache. Only
this user's files that nobody else may write qualify, each checked again (device, inode, size,
mtime, ctime) whenever it is opened; anything else is copied as before. A corrupt chunk still
fails the load (exit 5), and a later load of unchanged files hashes nothing again."""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import registry  # noqa: E402
from registry.blobs import inplace  # noqa: E402
from registry.blobs.base import blob_relpath  # noqa: E402
from registry.client import Registry  # noqa: E402
from registry.errors import IntegrityError, NotFoundError  # noqa: E402
from registry.format.bundle import BundleFile  # noqa: E402
from registry.runtime import torchrt  # noqa: E402

PIECE = 512 * 1024


class Split(torch.nn.Module):
    """A 1 MiB weight and a 1.2 MB buffer, each cut into pieces (``PIECE``), a 256 KiB weight
    that is one chunk, and small tensors (glue)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(512, 512)
        self.c = torch.nn.Linear(512, 128)
        self.norm = torch.nn.LayerNorm(128)
        self.register_buffer("table", torch.randn(300, 1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.c(self.a(x))) + self.table[:1, :128]


@pytest.fixture(scope="module")
def split_bundle(tmp_path_factory: pytest.TempPathFactory):
    from registry.bundler import bundle_exported_programs

    torch.manual_seed(0)
    model = Split().eval()
    x = torch.randn(3, 512)
    path = tmp_path_factory.mktemp("split") / "split.pt2b"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("registry.format.chunking.PIECE", PIECE)
        bundle_exported_programs(path, {"m": torch.export.export(model, (x,))})
    member = next(m for m in BundleFile.open(path).manifest.members if m.chunks)
    assert sum(1 for _sha, n in member.chunks if n == PIECE) >= 3  # a.weight in 2, table in 3
    with torch.no_grad():
        return path, x, model(x)


@pytest.fixture
def home(tmp_path: Path, split_bundle, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SQLite + a local store holding the bundle as t/m@1; the sandbox off (as for a bundle a
    trusted key signed)."""
    for var in [v for v in os.environ if v.startswith("PT2REG_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PT2REG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PT2REG_SANDBOX", "off")
    with Registry() as reg:
        reg.push(split_bundle[0], "t/m")
    return tmp_path / "home"


def _count_hashes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Paths hashed in place, one per chunk."""
    import registry.client.fetch as transfer

    seen: list[str] = []
    real = transfer.hash_in_place

    def spy(segment):
        seen.append(segment.path)
        return real(segment)

    monkeypatch.setattr(transfer, "hash_in_place", spy)
    return seen


def _mapped_from(address: int) -> str:
    """The file /proc/self/maps names for the mapping holding ``address`` ('' if anonymous)."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        m = re.match(r"([0-9a-f]+)-([0-9a-f]+) \S+ \S+ \S+ \S+\s*(.*)$", line)
        if m and int(m[1], 16) <= address < int(m[2], 16):
            return m[3]
    raise AssertionError(f"address {address:#x} is not mapped")


def _members_cached(home: Path) -> list[Path]:
    return [p for p in (home / "cache").rglob("*") if p.is_file() and "/members/" in str(p)]


def _assert_loaded_from_a_copy(home: Path, split_bundle, monkeypatch: pytest.MonkeyPatch) -> None:
    """``t/m@1`` loads right, nothing hashed in place, its program copied into the cache."""
    _path, x, expected = split_bundle
    hashed = _count_hashes(monkeypatch)
    loaded = registry.load("t/m@1")
    torch.testing.assert_close(loaded["m"](x), expected)
    assert hashed == [] and len(_members_cached(home)) == 1


needs_proc = pytest.mark.skipif(not inplace.MAPPABLE, reason="in-place loads need /proc/self/fd (Linux)")


@needs_proc
def test_a_cold_load_maps_every_weight_from_the_store_and_copies_nothing(home, split_bundle, monkeypatch):
    path, x, expected = split_bundle
    hashed = _count_hashes(monkeypatch)
    loaded = registry.load("t/m@1")
    torch.testing.assert_close(loaded["m"](x), expected)
    store = str(home / "store" / "blobs")
    assert hashed and all(p.startswith(store) for p in hashed)
    assert _members_cached(home) == []  # no copy of the program in the cache
    module = loaded["m"]._module
    params = {**dict(module.named_parameters()), **dict(module.named_buffers())}
    for name in ("a.weight", "c.weight", "table"):  # split (2 and 3 pieces) and whole
        where = _mapped_from(params[name].data_ptr())
        assert where.startswith(store), (name, where)
    # wanted as a file after all (here: asked for): copied into the cache, verified, exact
    member = next(m for m in BundleFile.open(path).manifest.members if m.chunks)
    file = loaded.source.member_file(member.path)
    with BundleFile.open(path).open_member(member.path) as f:
        assert file.read_bytes() == f.read()
    assert _members_cached(home) == [file]


@needs_proc
def test_a_later_load_of_unchanged_files_hashes_nothing_and_a_changed_file_is_hashed_again(
        home, split_bundle, monkeypatch):
    _path, x, expected = split_bundle
    hashed = _count_hashes(monkeypatch)
    registry.load("t/m@1")
    first = len(hashed)
    again = registry.load("t/m@1")
    torch.testing.assert_close(again["m"](x), expected)
    assert len(hashed) == first  # the stamp: every file as it was when hashed
    victim = Path(hashed[0])
    os.chmod(victim, 0o400)  # moves its ctime: nothing else changed, still usable in place
    third = registry.load("t/m@1")
    torch.testing.assert_close(third["m"](x), expected)
    assert len(hashed) == 2 * first and _members_cached(home) == []


@needs_proc
def test_a_pinned_ref_loaded_in_place_is_served_again_without_the_database(home, split_bundle, monkeypatch):
    """Its weights are not in the cache, but its manifest, signatures and pack index are: with
    the database gone, a load of the same digest pin reads the local store alone, hashes
    nothing (the stamp), and spools its audit event for the next database contact."""
    path, x, expected = split_bundle
    pin = f"t/m@{BundleFile.open(path).digest}"
    hashed = _count_hashes(monkeypatch)
    registry.load(pin)
    first = len(hashed)
    assert first and _members_cached(home) == []
    db = home / "registry.db"
    os.rename(db, home / "registry.db.away")
    again = registry.load(pin)
    torch.testing.assert_close(again["m"](x), expected)
    assert len(hashed) == first and again.source.version is None and not db.exists()
    spooled = [json.loads(line) for line in (home / "audit-spool.jsonl").read_text().splitlines()]
    assert [(e["action"], e["ref"]) for e in spooled] == [("pull", pin)]
    os.rename(home / "registry.db.away", db)
    with pytest.raises(NotFoundError):  # not under another model name: the database decides
        registry.load(f"other/m@{BundleFile.open(path).digest}")


@needs_proc
@pytest.mark.parametrize("damage", ["garbage", "other-store", "not-an-index", "a-wrong-index"])
def test_a_pin_whose_kept_pack_index_is_damaged_or_for_another_store_asks_the_database(
        home, split_bundle, monkeypatch, damage):
    path, x, expected = split_bundle
    digest = BundleFile.open(path).digest
    registry.load(f"t/m@{digest}")
    doc = home / "cache" / "packs" / f"{digest[7:]}.json"
    kept = json.loads(doc.read_text())
    doc.write_text({"garbage": "{not json", "other-store": json.dumps({**kept, "store": "file:///elsewhere"}),
                    "not-an-index": json.dumps({**kept, "index": "[1, 2"}),
                    "a-wrong-index": json.dumps({**kept, "index": {"packs": 5}})}[damage])
    with Registry() as reg:
        where = reg.locate(f"t/m@{digest}")
        assert where.pinned is None and where.version is not None  # the database answered
        loaded = registry.load(where.ref.__str__())
    torch.testing.assert_close(loaded["m"](x), expected)
    assert json.loads(doc.read_text())["store"] == kept["store"]  # written again by that fetch


@needs_proc
def test_a_pack_index_kept_as_a_string_still_serves_the_pin(home, split_bundle):
    """The cache keeps a version's index as JSON in its document; one written before, holding
    the index's text as a string, is read too."""
    path, _x, _expected = split_bundle
    digest = BundleFile.open(path).digest
    registry.load(f"t/m@{digest}")
    doc = home / "cache" / "packs" / f"{digest[7:]}.json"
    kept = json.loads(doc.read_text())
    assert isinstance(kept["index"], dict) and kept["index"]["packs"]   # its small chunks are packed
    with Registry() as reg:
        want = reg.locate(f"t/m@{digest}").pinned
    doc.write_text(json.dumps({**kept, "index": json.dumps(kept["index"])}))
    with Registry() as reg:
        got = reg.locate(f"t/m@{digest}").pinned
    assert want is not None and got is not None and got.packs == want.packs


@needs_proc
def test_pull_of_a_pin_loaded_in_place_records_its_version_number(home, split_bundle, tmp_path):
    path, _x, _expected = split_bundle
    pin = f"t/m@{BundleFile.open(path).digest}"
    registry.load(pin)
    with Registry() as reg:
        assert reg.locate(pin).pinned is not None
        result = reg.pull(pin, tmp_path / "out.pt2b")
        assert result.source.version == 1 and result.version.number == 1
        pulls = [e for e in reg.meta.events(model="t/m") if e.action == "pull"]
    assert pulls and pulls[-1].version == 1
    assert BundleFile.open(tmp_path / "out.pt2b").digest == BundleFile.open(path).digest


@needs_proc
def test_a_corrupt_piece_in_place_fails_the_load_and_leaves_no_stamp(home, split_bundle, monkeypatch):
    path, _x, _expected = split_bundle
    member = next(m for m in BundleFile.open(path).manifest.members if m.chunks)
    victim = "sha256:" + [sha for sha, n in member.chunks if n == PIECE][1]
    blob = home / "store" / blob_relpath(victim)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # one bit, in place: same size, same owner
        f.seek(4096)
        byte = f.read(1)
        f.seek(4096)
        f.write(bytes([byte[0] ^ 1]))
    hashed = _count_hashes(monkeypatch)
    with pytest.raises(IntegrityError, match=victim) as err:
        registry.load("t/m@1")
    assert err.value.exit_code == 5 and str(blob) in hashed
    assert _members_cached(home) == [] and not list((home / "cache").rglob("verified-in-place/*/*"))
    with Registry() as reg:
        assert "pull" not in [e.action for e in reg.meta.events(model="t/m")]


@needs_proc
def test_pt2reg_run_uses_the_weights_in_place_and_a_corrupt_piece_is_exit_5(home, split_bundle, tmp_path):
    """The CLI contract: ``run`` of a ref from a local store loads in place and prints the
    exported outputs; with a piece damaged in the store, exit 5 and one line naming the blob."""
    from tests.cli_inprocess import run_in_process

    path, x, expected = split_bundle
    inputs, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save((x,), inputs)
    ok = run_in_process("run", "t/m@1", "--inputs", str(inputs), "--output", str(out), "--json")
    assert ok.returncode == 0, ok.stderr
    torch.testing.assert_close(torch.load(out)[0], expected)
    assert _members_cached(home) == []
    member = next(m for m in BundleFile.open(path).manifest.members if m.chunks)
    victim = "sha256:" + [sha for sha, n in member.chunks if n == PIECE][0]
    blob = home / "store" / blob_relpath(victim)
    os.chmod(blob, 0o644)
    data = bytearray(blob.read_bytes())
    data[-1] ^= 1
    blob.write_bytes(bytes(data))  # in place: same inode, owner and size
    bad = run_in_process("run", "t/m@1", "--inputs", str(inputs), "--output", str(tmp_path / "bad.pt"))
    assert bad.returncode == 5, (bad.stdout, bad.stderr)
    lines = bad.stderr.strip().splitlines()
    assert len(lines) <= 2 and victim in lines[0] and "corrupt" in lines[0], lines
    assert not (tmp_path / "bad.pt").exists()


@needs_proc
@pytest.mark.parametrize("mode", [0o464, 0o446])
def test_a_store_file_others_may_write_is_copied_not_used_in_place(home, split_bundle, monkeypatch, mode):
    """A shared store (group or other may write its files): every chunk is copied into the
    cache and verified there, as before in-place loads."""
    for p in (home / "store" / "blobs").rglob("*"):
        if p.is_file():
            os.chmod(p, mode)
    _assert_loaded_from_a_copy(home, split_bundle, monkeypatch)


@needs_proc
def test_a_bundle_the_first_load_sandbox_vets_is_copied_not_used_in_place(home, split_bundle, monkeypatch):
    """No trusted key signed it and the sandbox is on: its child needs the complete file before
    anything is deserialized, so the weights are copied (and hashed) once, not hashed in place
    and then copied."""
    monkeypatch.setenv("PT2REG_SANDBOX", "on")
    _assert_loaded_from_a_copy(home, split_bundle, monkeypatch)


@needs_proc
def test_a_file_changed_before_torch_maps_it_makes_the_load_use_a_complete_copy(home, split_bundle, monkeypatch):
    """What torch maps is opened again and must still be the file first seen; here it is not
    (as if replaced meanwhile): the load waits, copies the member into the cache, verified,
    and loads that instead."""
    import sys

    _path, x, expected = split_bundle
    real = inplace.open_in_place
    refused: list[str] = []

    def replaced_for_torch(path, identity):  # the hash in place still finds the file unchanged
        if sys._getframe(1).f_code.co_name == "hash_in_place":
            return real(path, identity)
        refused.append(path)
        raise inplace.NotInPlace(f"{path} changed since it was first seen")

    monkeypatch.setattr(inplace, "open_in_place", replaced_for_torch)
    loads = []
    real_load = torchrt.load_exported_program
    monkeypatch.setattr(torchrt, "load_exported_program",
                        lambda *a, **k: loads.append(bool(k.get("elsewhere"))) or real_load(*a, **k))
    loaded = registry.load("t/m@1")
    torch.testing.assert_close(loaded["m"](x), expected)
    assert refused and loads == [True, False]
    assert len(_members_cached(home)) == 1  # the complete copy it loaded


def test_in_place_files_are_this_users_own_unshared_regular_files(tmp_path):
    f = tmp_path / "blob"
    f.write_bytes(b"x" * 5000)
    os.chmod(f, 0o444)
    found = inplace.in_place_file(f, size=5000)
    assert (found is not None) == inplace.MAPPABLE
    if found is None:
        return
    assert inplace.in_place_file(f, size=4999) is None
    link = tmp_path / "link"
    link.symlink_to(f)
    assert inplace.in_place_file(link) is None
    for mode in (0o664, 0o646, 0o466):
        os.chmod(f, mode)
        assert inplace.in_place_file(f) is None, oct(mode)
    os.chmod(f, 0o600)
    fresh = inplace.in_place_file(f)
    assert fresh is not None
    os.close(inplace.open_in_place(fresh.path, fresh.identity))
    os.chmod(f, 0o400)  # any chmod or write moves ctime: no longer the file first seen
    with pytest.raises(inplace.NotInPlace):
        inplace.open_in_place(fresh.path, fresh.identity)
    os.chmod(f, 0o600)
    now = inplace.in_place_file(f)
    other = tmp_path / "other"
    other.write_bytes(b"x" * 5000)
    os.replace(other, f)  # the same bytes, another file
    with pytest.raises(inplace.NotInPlace):
        inplace.open_in_place(now.path, now.identity)


@needs_proc
def test_hash_in_place_and_map_together_read_exactly_the_segments(tmp_path):
    import hashlib
    import mmap

    page = mmap.PAGESIZE
    data = [os.urandom(3 * page), os.urandom(2 * page), os.urandom(1000)]
    files = []
    for i, d in enumerate(data):
        p = tmp_path / f"p{i}"
        p.write_bytes(d)
        os.chmod(p, 0o444)
        files.append(inplace.in_place_file(p))
    segs, at = [], 0
    for f, d in zip(files, data):
        segs.append(inplace.InPlaceSegment(at, len(d), f.path, 0, f.identity))
        at += len(d)
    odd = inplace.InPlaceSegment(0, 5000, files[0].path, page + 123, files[0].identity)
    assert inplace.hash_in_place(odd) == hashlib.sha256(data[0][page + 123:page + 5123]).hexdigest()
    region = inplace.map_together(segs)
    t = torch.frombuffer(region, dtype=torch.uint8)
    del region
    assert bytes(t.numpy()) == b"".join(data)
    t[0] = t[0] ^ 1  # copy-on-write: the file keeps its bytes
    assert Path(files[0].path).read_bytes() == data[0]
    with pytest.raises(inplace.NotInPlace):  # a piece that does not end on a page boundary
        inplace.map_together([segs[2], segs[0]._replace(offset=1000)])
    short = inplace.InPlaceSegment(0, 4 * page, files[1].path, 0, files[1].identity)
    with pytest.raises(inplace.NotInPlace):
        inplace.hash_in_place(short)


def test_only_local_filesystems_hold_files_used_in_place():
    mountinfo = "\n".join([
        "22 1 8:1 / / rw,relatime - ext4 /dev/vda rw",
        "30 22 0:40 / /mnt/team\\040store rw - nfs4 srv:/export rw,vers=4.2",
        "31 22 0:41 / /mnt/fuse rw - fuse.sshfs host:/ rw",
        "32 22 0:42 / /dev/shm rw - tmpfs tmpfs rw",
        "garbage line without a separator",
    ])
    ext4, nfs = os.makedev(8, 1), os.makedev(0, 40)
    assert inplace.filesystem_type(ext4, "/srv/x", mountinfo) == "ext4"
    assert inplace.filesystem_type(nfs, "/anything", mountinfo) == "nfs4"  # by device, whatever the path
    assert inplace.filesystem_type(os.makedev(0, 99), "/mnt/team store/blobs/x", mountinfo) == "nfs4"
    assert inplace.filesystem_type(os.makedev(0, 99), "/mnt/fuse/a", mountinfo) == "fuse.sshfs"
    assert inplace.filesystem_type(os.makedev(0, 99), "/dev/shm/x", mountinfo) == "tmpfs"
    assert {"nfs4", "fuse.sshfs", None}.isdisjoint(inplace.LOCAL_FILESYSTEMS)
    assert {"ext4", "xfs", "tmpfs", "overlay"} <= inplace.LOCAL_FILESYSTEMS
