"""A cold ``registry.load`` deserializes the graph while the raw weights are still being fetched
(``client.fetch.fetch_members_deferred``), and is exactly as safe as a load that waited:
torch reads no byte that is not verified, a chunk that does not match fails the load and
leaves nothing in the cache, a load that fails first stops the fetch, and the pull is audited
only once every chunk matched."""
from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import registry  # noqa: E402
from registry.blobs.base import blob_relpath  # noqa: E402
from registry.client import Registry  # noqa: E402
from registry.errors import IntegrityError, NotFoundError  # noqa: E402
from registry.format.bundle import BundleFile  # noqa: E402
from registry.format.chunking import chunks_inside  # noqa: E402
from registry.format.zipsafe import read_canonical_entries  # noqa: E402
from registry.runtime import torchrt  # noqa: E402
from registry.runtime.loader import load_bundle  # noqa: E402


class Weighty(torch.nn.Module):
    """Weights of 1 MiB and more (each its own chunk), small ones (glue), a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.a = torch.nn.Linear(512, 512)
        self.b = torch.nn.Linear(512, 512)
        self.norm = torch.nn.LayerNorm(512)
        self.register_buffer("table", torch.randn(300, 1000))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.b(self.a(x))) + self.table[:1, :512]


@pytest.fixture(scope="module")
def weighty(tmp_path_factory: pytest.TempPathFactory):
    from registry.bundler import bundle_exported_programs

    torch.manual_seed(0)
    model = Weighty().eval()
    x = torch.randn(3, 512)
    path = tmp_path_factory.mktemp("weighty") / "weighty.pt2b"
    bundle_exported_programs(path, {"m": torch.export.export(model, (x,))})
    with torch.no_grad():
        return path, x, model(x)


@pytest.fixture
def home(tmp_path: Path, weighty, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A registry home (SQLite + local store) holding the bundle as t/m@1; the sandbox off, as
    for a bundle a trusted key signed (with the sandbox on, a cold load waits for every chunk)."""
    for var in [v for v in os.environ if v.startswith("PT2REG_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PT2REG_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PT2REG_SANDBOX", "off")
    with Registry() as reg:
        reg.push(weighty[0], "t/m")
    return tmp_path / "home"


def _weight_chunks(bundle_path: Path) -> set[str]:
    """Digests of the program's chunks that hold nothing but raw weight bytes (the oracle:
    from the full canonical read of the member, not the loader's own plan)."""
    bundle = BundleFile.open(bundle_path)
    member = next(m for m in bundle.manifest.members if m.chunks)
    offset, size = bundle.member_span(member.path)
    entries = read_canonical_entries(bundle.path, offset=offset, size=size)
    spans = [(e.data_offset - offset, e.size) for e in entries.values()
             if "/data/weights/" in e.name and not e.name.endswith(".json")]
    chunks = list(member.chunk_spans())
    return {"sha256:" + chunks[i][0] for i in chunks_inside([(o, n) for _s, o, n in chunks], spans)}


class HeldStore:
    """The local store, with the chunks in ``held`` not delivered until ``release`` is set
    (all copied: none is verified in place: the capability declared off)."""

    maps_in_place = False

    def __init__(self, inner, held: set[str]) -> None:
        self.inner, self.held = inner, held
        self.release = threading.Event()
        self.released_in_time = None

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def get_parts(self, fd, parts, *, progress=None, on_done=None):
        free = [i for i, p in enumerate(parts) if p.digest not in self.held]
        held = [i for i, p in enumerate(parts) if p.digest in self.held]
        for group in (free, held):
            if group is held and group:
                self.released_in_time = self.release.wait(60)
            self.inner.get_parts(fd, [parts[i] for i in group], progress=progress,
                                 on_done=None if on_done is None else (lambda j, g=group: on_done(g[j])))

    def part_fetches(self, fd, parts, *, progress=None, on_done=None):
        """The same hold on the calls a pull runs on a pool of its own (``assemble_member``)."""
        calls = self.inner.part_fetches(fd, parts, progress=progress, on_done=on_done)

        def held(call):
            def run():
                self.released_in_time = self.release.wait(60)
                call()
            return run
        return [held(c) if p.digest in self.held else c for p, c in zip(parts, calls)]


def _spy_loads(monkeypatch: pytest.MonkeyPatch, on_call=None) -> list[frozenset[str]]:
    calls: list[frozenset[str]] = []
    real = torchrt.load_exported_program

    def spy(*args, **kwargs):
        calls.append(frozenset(kwargs.get("unverified", ())))
        if on_call is not None:
            on_call()
        return real(*args, **kwargs)

    monkeypatch.setattr(torchrt, "load_exported_program", spy)
    return calls


def _leftovers(home: Path) -> list[Path]:
    return [p for p in (home / "cache").rglob("*") if p.name.endswith(".incomplete")]


def test_torch_deserializes_while_the_weights_are_still_fetching(home, weighty, monkeypatch):
    path, x, expected = weighty
    held = _weight_chunks(path)
    assert len(held) >= 3  # a.weight, b.weight, table
    with Registry() as reg:
        store = HeldStore(reg.blobs, held)
        reg._blobs = store
        calls = _spy_loads(monkeypatch, on_call=store.release.set)  # torch starts: let them come
        src = reg.materialize("t/m@1", defer_weights=True)
        assert src.pending is not None and not store.release.is_set()
        member = next(m for m in src.manifest.members if m.chunks)
        assert src.member_file(member.path).name.endswith(".incomplete")
        loaded = load_bundle(src, device="cpu", sandbox=None)
        events = [e.action for e in reg.meta.events(model="t/m")]
    assert store.released_in_time is True  # the weights arrived only after torch had started
    assert calls and {"data/weights/weight_0"} <= calls[0] and len(calls) == 1
    torch.testing.assert_close(loaded["m"](x), expected)
    final = loaded.source.member_file(member.path)
    assert loaded.source.pending is None and final == reg.cache.member_path(member)
    assert final.stat().st_mode & 0o777 == 0o444 and reg.cache.usable_member(member)
    assert _leftovers(home) == [] and events.count("pull") == 1


def _shared(home: Path) -> None:
    """Make the store's files group-writable, as in a directory a team shares: none is used in
    place (``test_load_in_place.py``), every chunk is copied into the cache."""
    for p in (home / "store" / "blobs").rglob("*"):
        if p.is_file():
            os.chmod(p, 0o464)


def test_registry_load_of_a_ref_overlaps_and_a_warm_load_needs_no_fetch(home, weighty, monkeypatch):
    path, x, expected = weighty
    _shared(home)
    calls = _spy_loads(monkeypatch)
    with Registry() as reg:  # a crashed earlier fetch's temp file, and a live one's
        dest = reg.cache.member_path(next(m for m in BundleFile.open(path).manifest.members if m.chunks))
    dest.parent.mkdir(parents=True, exist_ok=True)
    stale, live = (dest.parent / f".{dest.name}.{tag}.incomplete" for tag in ("crashed", "live"))
    stale.write_bytes(b"x"), live.write_bytes(b"x")
    os.utime(stale, (time.time() - 2 * 86400,) * 2)
    cold = registry.load("t/m@1")
    assert not stale.exists() and live.exists()  # the next fetch of that member swept the stale one
    assert calls[0] and cold.source.pending is None
    torch.testing.assert_close(cold["m"](x), expected)
    warm = registry.load("t/m@1")  # cached: nothing pending, nothing unverified
    assert calls[-1] == frozenset() and warm.source.files == cold.source.files
    torch.testing.assert_close(warm["m"](x), expected)


def test_a_weight_chunk_that_does_not_match_fails_the_load_and_leaves_nothing(home, weighty, monkeypatch):
    path, _x, _expected = weighty
    bad = sorted(_weight_chunks(path))[0]
    blob = home / "store" / blob_relpath(bad)
    os.chmod(blob, 0o644)
    with open(blob, "r+b") as f:  # one bit flipped in the store
        f.seek(100)
        byte = f.read(1)
        f.seek(100)
        f.write(bytes([byte[0] ^ 1]))
    calls = _spy_loads(monkeypatch)
    with pytest.raises(IntegrityError, match=bad):
        registry.load("t/m@1")
    assert calls and calls[0]  # torch had started on the verified part
    assert _leftovers(home) == [] and not list((home / "cache").glob("members/*/*"))
    with Registry() as reg:
        assert "pull" not in [e.action for e in reg.meta.events(model="t/m")]


def test_a_load_that_fails_before_the_weights_arrive_stops_the_fetch(home, weighty):
    with pytest.raises(NotFoundError, match="no program 'nope'"):
        registry.load("t/m@1", programs=["nope"])
    assert _leftovers(home) == []
    assert not [t for t in threading.enumerate() if t.name == "pt2reg-fetch"]


def test_a_record_torch_would_read_makes_the_load_wait_for_it(home, weighty, monkeypatch):
    """A record that cannot be viewed in place (here: every one) is copied by torch, which
    would read unverified bytes: the load waits for every chunk and deserializes again."""
    path, x, expected = weighty
    monkeypatch.setattr(torchrt.mapping, "_mapped_file_map", lambda *a, **k: None)
    calls = _spy_loads(monkeypatch)
    loaded = registry.load("t/m@1")
    assert len(calls) == 2 and calls[0] and calls[1] == frozenset()
    torch.testing.assert_close(loaded["m"](x), expected)
    assert _leftovers(home) == []


def test_the_sandbox_and_copied_weights_wait_for_every_chunk(home, weighty, monkeypatch):
    """What reads the weights (the first-load sandbox's child, a load that copies them) only
    starts once every chunk matched."""
    path, x, expected = weighty
    calls = _spy_loads(monkeypatch)
    copied = registry.load("t/m@1", map_weights=False)
    torch.testing.assert_close(copied["m"](x), expected)
    monkeypatch.setenv("PT2REG_SANDBOX", "on")
    for p in sorted((home / "cache").glob("members/*/*")):
        os.chmod(p, 0o644)
        p.unlink()
    sandboxed = registry.load("t/m@1")
    torch.testing.assert_close(sandboxed["m"](x), expected)
    assert calls == [frozenset(), frozenset()]


def test_pt2reg_run_of_a_ref_overlaps_too_and_a_refused_run_leaves_nothing(home, weighty, monkeypatch, tmp_path):
    from tests.cli_inprocess import run_in_process

    path, x, expected = weighty
    inputs, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save((x,), inputs)
    calls = _spy_loads(monkeypatch)
    bad = run_in_process("run", "t/m@1", "--program", "nope", "--inputs", str(inputs))
    assert bad.returncode == 2 and "no program 'nope'" in bad.stderr
    assert _leftovers(home) == [] and not [t for t in threading.enumerate() if t.name == "pt2reg-fetch"]
    assert calls == []
    ok = run_in_process("run", "t/m@1", "--inputs", str(inputs), "--output", str(out), "--json")
    assert ok.returncode == 0, ok.stderr
    assert calls and calls[0]  # deserialized while the weights were still unverified
    torch.testing.assert_close(torch.load(out)[0], expected)
    assert _leftovers(home) == []


@pytest.mark.parametrize("reg_env", ["moto", "team-server"], indirect=True)
def test_a_cold_run_overlaps_on_s3_and_through_the_server(reg_env, weighty, monkeypatch, tmp_path):
    """S3 directly, and a real ``pt2reg serve`` (PostgreSQL, SeaweedFS, presigned URLs) -- the
    other two ``get_parts`` (the local store's is above): the cold run deserializes before the
    weights are verified and gives the exported outputs; a weight chunk damaged in the store
    fails another machine's cold run with exit 5 and leaves no file in its cache."""
    path, x, expected = weighty
    monkeypatch.setenv("PT2REG_SANDBOX", "off")
    assert reg_env.cli("push", str(path), "--name", "t/m").returncode == 0
    inputs, out = tmp_path / "in.pt", tmp_path / "out.pt"
    torch.save((x,), inputs)
    calls = _spy_loads(monkeypatch)
    r = reg_env.cli("run", "t/m@1", "--inputs", str(inputs), "--output", str(out))
    assert r.returncode == 0, r.stderr
    assert calls and calls[0]
    torch.testing.assert_close(torch.load(out)[0], expected)
    reg_env.corrupt_blob(sorted(_weight_chunks(path))[0])
    other = tmp_path / "other-home"
    r = reg_env.cli("run", "t/m@1", "--inputs", str(inputs), home=other)
    assert r.returncode == 5 and r.stderr.count("\n") <= 3, r.stderr
    assert "corrupt" in r.stderr or "does not match" in r.stderr
    assert not [p for p in other.rglob("*") if p.name.endswith(".incomplete") or p.parent.parent.name == "members"]
