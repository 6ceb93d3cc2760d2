"""Weight-level chunking: pure planning, plus a fine-tune that shares all but one layer."""
import subprocess
import sys

import pytest

from registry.format.chunking import plan_chunks
from tests.fixtures_pt2 import ROOT


def test_plan_covers_the_member_exactly():
    spans = [(100, 70_000), (70_200, 10), (80_000, 100_000)]
    chunks = plan_chunks(spans, 200_000)
    assert chunks == [(0, 100), (100, 70_000), (70_100, 9_900), (80_000, 100_000), (180_000, 20_000)]
    assert sum(n for _s, n in chunks) == 200_000
    assert plan_chunks([], 10) == [(0, 10)]
    # hostile spans (overlapping, out of range) are ignored, never produce a gap or overlap
    weird = plan_chunks([(0, 100_000), (50_000, 100_000), (150_000, 10**9)], 200_000)
    assert weird == [(0, 100_000), (100_000, 100_000)]


FINETUNE = """
import sys, torch
class M(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.layers = torch.nn.ModuleList([torch.nn.Linear(256, 256) for _ in range(6)])
    def forward(s, x):
        for l in s.layers: x = l(x)
        return x
torch.manual_seed(0); m = M()
torch.export.save(torch.export.export(m, (torch.randn(2, 256),)), sys.argv[1] + "/base.pt2")
with torch.no_grad(): m.layers[2].weight.mul_(1.01)
torch.export.save(torch.export.export(m, (torch.randn(2, 256),)), sys.argv[1] + "/ft.pt2")
"""


@pytest.fixture(scope="module")
def finetune_pair(tmp_path_factory):
    out = tmp_path_factory.mktemp("ft")
    subprocess.run([sys.executable, "-c", FINETUNE, str(out)], check=True, cwd=ROOT, capture_output=True)
    return out


def test_finetune_of_one_layer_in_six_stores_about_that_layer(finetune_pair, tmp_path):
    from registry.bundler import ProgramInput, build_bundle
    from registry.client import Registry
    from registry.config import Settings

    base = build_bundle(tmp_path / "base.pt2b", [ProgramInput("m", finetune_pair / "base.pt2")])
    ft = build_bundle(tmp_path / "ft.pt2b", [ProgramInput("m", finetune_pair / "ft.pt2")])
    member = base.manifest.members[0]
    assert len(member.chunks) > 6  # every weight is its own chunk

    reg = Registry(Settings.resolve(home=str(tmp_path / "home")))
    reg.push(base.path, "m")
    size = lambda: sum(b.size for b in reg.blobs.list())  # noqa: E731
    before = size()
    result = reg.push(ft.path, "m")
    growth = (size() - before) / ft.path.stat().st_size
    assert result.created and growth <= 0.25, growth
    # the fine-tune pulls back byte-identical, from shared and new chunks
    reg2 = Registry(Settings.resolve(home=str(tmp_path / "other-home"), db=reg.settings.db_url,
                                     store=reg.settings.store_url))
    out = tmp_path / "pulled.pt2b"
    reg2.pull("m@2", out)
    assert out.read_bytes() == ft.path.read_bytes()


def test_weights_shared_between_programs_are_stored_once(finetune_pair, tmp_path):
    from registry.bundler import ProgramInput, build_bundle
    from registry.client import Registry
    from registry.config import Settings

    two = build_bundle(tmp_path / "two.pt2b", [ProgramInput("encoder", finetune_pair / "base.pt2"),
                                               ProgramInput("decoder", finetune_pair / "ft.pt2")])
    reg = Registry(Settings.resolve(home=str(tmp_path / "home")))
    reg.push(two.path, "two")
    stored = sum(b.size for b in reg.blobs.list())
    assert stored < 0.7 * two.path.stat().st_size  # 5 of 6 layers are shared: about 7/12


def test_tampered_chunk_list_is_refused(finetune_pair, tmp_path):
    import copy

    from registry.bundler import ProgramInput, build_bundle
    from registry.errors import IntegrityError
    from registry.format.bundle import BundleFile, write_bundle
    from registry.format.manifest import Manifest

    good = build_bundle(tmp_path / "g.pt2b", [ProgramInput("m", finetune_pair / "base.pt2")])
    raw = copy.deepcopy(good.manifest.to_json())
    chunks = raw["members"][0]["chunks"]
    real = chunks[1]["sha256"]
    chunks[1]["sha256"] = "0" * 64  # a lie about one weight
    forged = Manifest.from_raw(raw)
    src = BundleFile.open(good.path)
    # the writer checks every chunk in the pass that copies it: it never writes the lie
    with pytest.raises(IntegrityError, match="chunk 1"):
        write_bundle(tmp_path / "no.pt2b", forged, {m.path: (lambda p=m.path: src.open_member(p))
                                                     for m in forged.members})
    assert not (tmp_path / "no.pt2b").exists()
    # a bundle edited in place (same length, so the zip stays well formed) is caught on verify
    out = tmp_path / "forged.pt2b"
    out.write_bytes(good.path.read_bytes().replace(real.encode(), b"0" * 64, 1))
    assert BundleFile.open(out).manifest.digest == forged.digest
    with pytest.raises(IntegrityError, match="chunk 1"):
        BundleFile.open(out).verify()


def test_a_bundle_is_made_durable_while_it_is_copied(finetune_pair, tmp_path, monkeypatch):
    """``write_bundle`` flushes its temp file every ``FLUSH_BYTES`` while the chunks are still
    being copied (``parallel.Flusher``), so the final fsync has little left; a flush that
    fails fails the write and leaves nothing behind."""
    import os

    from registry import parallel
    from registry.bundler import ProgramInput, build_bundle

    monkeypatch.setattr(parallel.writeback, "FLUSH_BYTES", 64 * 1024)
    flushed, real = [], os.fdatasync

    def fdatasync(fd):
        flushed.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    out = build_bundle(tmp_path / "b.pt2b", [ProgramInput("m", finetune_pair / "base.pt2")]).path
    assert out.stat().st_size > 20 * parallel.writeback.FLUSH_BYTES
    assert flushed and all(os.path.dirname(p) == str(tmp_path) and p != str(out) for p in flushed)

    def eio(fd):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", eio)
    with pytest.raises(OSError, match="Input/output error"):
        build_bundle(tmp_path / "c.pt2b", [ProgramInput("m", finetune_pair / "base.pt2")])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.pt2b"]


def test_chunks_inside_spans():
    from registry.format.chunking import chunks_inside

    chunks = [(0, 100), (100, 50), (150, 50), (200, 10), (210, 0)]
    assert chunks_inside(chunks, [(100, 100), (205, 10)]) == [1, 2]
    assert chunks_inside(chunks, [(90, 200)]) == [1, 2, 3]   # a chunk must lie wholly inside
    assert chunks_inside(chunks, [(101, 99), (0, 0)]) == [2]
    assert chunks_inside(chunks, []) == []


class _ReadLog:
    """A file whose every read is checked against the ranges ``ensure`` was asked for first."""

    def __init__(self, fp):
        self.fp, self.allowed, self.pos = fp, [], 0

    def ensure(self, lo, hi):
        self.allowed.append((lo, hi))

    def seek(self, pos, whence=0):
        self.pos = self.fp.seek(pos, whence)
        return self.pos

    def read(self, n=-1):
        data = self.fp.read(n)
        lo, hi = self.pos, self.pos + len(data)
        assert any(a <= lo and hi <= b for a, b in self.allowed), (lo, hi, self.allowed)
        self.pos = hi
        return data


def test_weight_spans_come_from_the_end_records_and_central_directory_alone(finetune_pair, tmp_path):
    """What a cold load reads to decide which chunks may still be fetching while torch
    deserializes: the end records, then the central directory, nothing else (no local header,
    no data), and the member offsets it derives are the ones the full canonical check finds."""
    from registry.bundler import ProgramInput, build_bundle
    from registry.format.bundle import BundleFile
    from registry.format.chunking import chunks_inside
    from registry.format.zipsafe import END_RECORDS_MAX, canonical_data_spans, read_canonical_entries

    build_bundle(tmp_path / "b.pt2b", [ProgramInput("m", finetune_pair / "base.pt2")])
    bundle = BundleFile.open(tmp_path / "b.pt2b")
    member = bundle.manifest.members[0]
    offset, size = bundle.member_span(member.path)
    program = tmp_path / "m.pt2"
    with open(bundle.path, "rb") as f:
        f.seek(offset)
        program.write_bytes(f.read(size))
    with open(program, "rb") as fp:
        log = _ReadLog(fp)
        spans = canonical_data_spans(log, size, where="m", ensure=log.ensure)
    assert log.allowed[0] == (size - END_RECORDS_MAX, size) and log.allowed[1][1] == size
    assert log.allowed[1][0] > size * 0.9  # the central directory: the archive's last bytes
    entries = read_canonical_entries(program)
    assert spans == [(e.name, e.data_offset, e.size) for e in entries.values()]
    weights = [(o, n) for name, o, n in spans if "/data/weights/" in name and not name.endswith(".json")]
    inside = chunks_inside([(o, n) for _sha, o, n in member.chunk_spans()], weights)
    chunks = list(member.chunk_spans())
    # the six 256 KiB weight matrices; the biases (1 KiB) lie in glue chunks with the headers
    assert inside == [i for i, (_sha, _o, n) in enumerate(chunks) if n == 256 * 256 * 4] and len(inside) == 6
