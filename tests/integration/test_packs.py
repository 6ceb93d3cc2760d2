"""Packs, end to end on every setup (SQLite + directory, moto S3, PostgreSQL + SeaweedFS, and
both behind a real ``pt2reg serve``): every tensor is its own chunk, the small ones are stored in
pack blobs, a fine-tune that changes a few tiny tensors stores about what changed, a damaged
pack is caught on pull, gc keeps every pack a version reads from, and a registry server checks
a pusher's pack index against the packs' bytes and never lends a token another model's packs."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.shared import built_once

#: tiny tensors (each under 64 KiB: stored in packs) and one weight of its own
TINY, CHANGED = 240, (3, 77, 150, 201)


def _export(out: Path, bump: tuple[int, ...], big: bool = False) -> None:
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            g = torch.Generator().manual_seed(0)
            self.ps = torch.nn.ParameterList(
                torch.nn.Parameter(torch.randn(64 + (i * 37) % 900, generator=g)) for i in range(TINY))
            self.big = torch.nn.Parameter(torch.randn(320, 1024, generator=g))   # 1.25 MiB

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x @ self.big[:, :4] + torch.cat([p.flatten() for p in self.ps]).sum()

    model = Tiny()
    with torch.no_grad():
        for i in bump:
            model.ps[i].add_(1.0)
        if big:
            model.big.add_(1.0)
    # another batch size changes the graph's JSON (its own chunk): ``other`` shares only tiny tensors
    torch.export.save(torch.export.export(model, (torch.randn(3 if big else 2, 320),)), out)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory) -> dict[str, Path]:
    """``base``: a program of 240 tiny tensors and one 1.25 MiB weight; ``ft``: the same with
    4 tiny tensors changed (a merged-LoRA-like fine-tune); ``other``: ``ft`` with the big weight
    changed too, and another graph (it shares only tiny tensors with ``base``)."""
    def build(out: Path) -> None:
        from registry.bundler import ProgramInput, build_bundle

        for name, bump, big in (("base", (), False), ("ft", CHANGED, False), ("other", CHANGED, True)):
            _export(out / f"{name}.pt2", bump, big)
            build_bundle(out / f"{name}.pt2b", [ProgramInput("model", out / f"{name}.pt2")], metadata={"n": name})

    out = built_once(tmp_path_factory, "tiny-tensors", build)
    return {name: out / f"{name}.pt2b" for name in ("base", "ft", "other")}


def _ok(r) -> dict:
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def _version(reg_env, ref: str):
    from registry.refs import Ref
    from registry.store import SqlMetadataStore

    with SqlMetadataStore(reg_env.db) as meta:
        return meta.resolve(Ref.parse(ref))


def _packs(reg_env, ref: str):
    from registry.format.packs import PackIndex

    return PackIndex.from_json(_version(reg_env, ref).packs_json)


def test_tiny_tensors_are_packed_and_a_fine_tune_stores_what_changed(reg_env, tiny, tmp_path):
    from registry.format.bundle import BundleFile

    base = _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    chunks = [c for m in BundleFile.open(tiny["base"]).manifest.members for c in m.chunks]
    assert len(chunks) > TINY                          # every tensor its own chunk
    index = _packs(reg_env, "tiny@1")
    assert 1 <= len(index.packs) <= 2                  # ...stored in one or two blobs, not 240
    assert len(index.locations()) >= TINY
    assert base["uploaded_bytes"] >= 0.9 * tiny["base"].stat().st_size
    ft = _ok(reg_env.cli("push", tiny["ft"], "--name", "tiny", "--json"))
    assert ft["version"] == 2
    # what a perfect store would add: the 4 changed tensors (< 16 KiB) with their headers, the
    # central directory (CRCs changed) and the manifest; far below a glue chunk's re-store
    size = tiny["ft"].stat().st_size
    assert ft["uploaded_bytes"] < 0.04 * size, ft
    assert ft["skipped_bytes"] > 0.9 * size
    ft_index = _packs(reg_env, "tiny@2")
    assert {p.digest for p in index.packs} <= {p.digest for p in ft_index.packs}  # reused, not copied
    # both pull back byte for byte, into fresh clients
    for ref, src in (("tiny@1", tiny["base"]), ("tiny@2", tiny["ft"])):
        out = tmp_path / f"{ref.replace('@', '-')}.pt2b"
        _ok(reg_env.cli("pull", ref, "-o", out, "--json", home=tmp_path / f"client-{ref}"))
        assert out.read_bytes() == src.read_bytes()


def test_a_damaged_pack_is_caught_on_pull_and_leaves_nothing(reg_env, tiny, tmp_path):
    _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    pack = _packs(reg_env, "tiny@1").packs[0].digest
    reg_env.corrupt_blob(pack)
    client = tmp_path / "client"
    out = tmp_path / "out.pt2b"
    r = reg_env.cli("pull", "tiny@1", "-o", out, home=client)
    assert r.returncode == 5, r.stderr
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and f"from pack {pack}" in lines[0] and "does not match its digest" in lines[0], r.stderr
    assert not out.exists()
    cached = [p for p in (client / "cache").rglob("*") if p.is_file() and "members" in p.parts]
    assert not cached, cached


@pytest.mark.parametrize("altered", ["not an index", '{"packs": [{"digest": "sha256:00", "size": 1, "chunks": []}]}'])
def test_a_pack_index_altered_in_the_database_fails_the_pull_and_leaves_nothing(reg_env, tiny, tmp_path, altered):
    """A pull reads the stored pack index while the large chunks already come (never in a
    pack): an index that is not valid still fails it (exit 5, one line), with no chunked member
    cached and no bundle written; and so does a pull that finds every member cached."""
    _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    cached_home = tmp_path / "cached"
    _ok(reg_env.cli("pull", "tiny@1", "-o", tmp_path / "first.pt2b", "--json", home=cached_home))
    assert reg_env.sql("UPDATE version_packs SET packs_json = :t", "SELECT packs_json FROM version_packs",
                       t=altered) == [[], [(altered,)]]   # the one version's index, altered
    for home in (tmp_path / "client", cached_home):
        out = tmp_path / f"{home.name}.pt2b"
        r = reg_env.cli("pull", "tiny@1", "-o", out, home=home)
        assert r.returncode == 5, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
        assert len(lines) == 1 and "tiny@1: its stored pack index is invalid" in lines[0], r.stderr
        assert not out.exists()
    cached = [p for p in (tmp_path / "client" / "cache").rglob("*") if p.is_file() and "members" in p.parts]
    assert not cached, cached


def test_gc_keeps_every_pack_a_version_reads(reg_env, tiny, tmp_path):
    _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    _ok(reg_env.cli("push", tiny["ft"], "--name", "tiny", "--json"))
    orphan = reg_env.put_orphan(b"nobody's pack")
    packs = {p.digest for ref in ("tiny@1", "tiny@2") for p in _packs(reg_env, ref).packs}
    r = reg_env.cli("gc", "--json")
    assert r.returncode == 0, r.stderr
    assert not reg_env.blob_exists(orphan)
    assert all(reg_env.blob_exists(p) for p in packs)
    out = tmp_path / "ft.pt2b"
    _ok(reg_env.cli("pull", "tiny@2", "-o", out, "--json", home=tmp_path / "client"))
    assert out.read_bytes() == tiny["ft"].read_bytes()


def test_a_pack_cut_short_in_the_store_is_mended_by_pushing_again(reg_env, tiny, tmp_path):
    """A pack lost or truncated in the store is not reused by the next push: its chunks are
    packed again, and the same bundle pushed again writes the same pack, which mends the
    version that reads from it."""
    _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    pack = _packs(reg_env, "tiny@1").packs[0]
    loc = reg_env.blob_location(pack.digest)
    if isinstance(loc, Path):
        loc.chmod(0o644)
        loc.write_bytes(loc.read_bytes()[:pack.size // 2])
    else:
        client = reg_env.s3_client()
        body = client.get_object(Bucket=loc[0], Key=loc[1])["Body"].read()
        client.put_object(Bucket=loc[0], Key=loc[1], Body=body[:pack.size // 2])
    r = reg_env.cli("pull", "tiny@1", "-o", tmp_path / "broken.pt2b", home=tmp_path / "client-broken")
    assert r.returncode == 5, r.stderr
    again = _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    assert again["version"] == 1 and again["uploaded_bytes"] >= pack.size     # the pack written again
    out = tmp_path / "mended.pt2b"
    _ok(reg_env.cli("pull", "tiny@1", "-o", out, "--json", home=tmp_path / "client-mended"))
    assert out.read_bytes() == tiny["base"].read_bytes()


# not on moto: storing 250 tiny blobs one PUT each is 13 s there, and S3 is covered by ``team``
@pytest.mark.parametrize("reg_env", ["local", "server", pytest.param("team", marks=pytest.mark.integration),
                                     pytest.param("team-server", marks=pytest.mark.integration)], indirect=True)
def test_an_old_style_version_is_reused_as_blobs_not_packed_again(reg_env, tiny, tmp_path, monkeypatch):
    """A version pushed before packs stored its small chunks as blobs: a later push reuses those
    blobs (direct stores know them) and both versions pull back."""
    import registry.client.fetch as fetch
    import registry.client.upload as upload

    for module in (upload, fetch):
        monkeypatch.setattr(module, "PACK_BELOW", 1)     # the old layout: every chunk a blob
    _ok(reg_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    assert not _packs(reg_env, "tiny@1")
    monkeypatch.undo()
    ft = _ok(reg_env.cli("push", tiny["ft"], "--name", "tiny", "--json"))
    assert ft["uploaded_bytes"] < 0.3 * tiny["ft"].stat().st_size, ft
    for ref, src in (("tiny@1", tiny["base"]), ("tiny@2", tiny["ft"])):
        out = tmp_path / f"{ref.replace('@', '-')}.pt2b"
        _ok(reg_env.cli("pull", ref, "-o", out, "--json", home=tmp_path / f"client-{ref}"))
        assert out.read_bytes() == src.read_bytes()
    r = reg_env.cli("audit", "--verify")
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.fixture
def server_env(request, tmp_path):
    from tests.fixtures_registry import make_env

    return make_env("server", tmp_path, request)


def test_the_server_refuses_a_false_pack_index(server_env, tiny, monkeypatch):
    """A pusher's index is a claim: one that places a chunk where the pack holds other bytes is
    refused (exit 5, one line) and nothing is recorded, so no later push can reuse it. The
    server remembers what it checked: the same false publish again is refused without reading
    a pack, and the honest push reads only the entry it had not seen."""
    import dataclasses
    import hashlib

    import httpx

    import registry.client.push as push
    from registry.client.upload import NewPack
    from registry.format.packs import Pack, PackEntry, PackIndex

    real = push.plan_upload

    def lying(bundle, meta, blobs, name, **kwargs):
        """Upload one more pack, honest about its own bytes (the bundle's first bytes), and
        claim one tiny tensor's chunk is in it."""
        plan = real(bundle, meta, blobs, name, **kwargs)
        pack = plan.index.packs[0]
        victim = pack.entries[5]
        with open(bundle.path, "rb") as f:
            other = f.read(victim.size)
        extra = NewPack("sha256:" + hashlib.sha256(other).hexdigest(), victim.size, ((0, victim.size),))
        index = PackIndex((Pack.of(pack.digest, pack.size, [e for e in pack.entries if e != victim]),
                           Pack.of(extra.digest, extra.size, [PackEntry(victim.chunk, 0, victim.size)]),
                           *plan.index.packs[1:]))
        return dataclasses.replace(plan, packs=[*plan.packs, extra], index=index)

    def checked() -> int:
        answer = httpx.get(f"{server_env.url}/v1/stats", headers={"Authorization": f"Bearer {server_env.token}"})
        return answer.json()["pack_entries_checked"]

    monkeypatch.setattr(push, "plan_upload", lying)
    r = server_env.cli("push", tiny["base"], "--name", "tiny")
    assert r.returncode == 5, r.stderr
    assert "cannot publish tiny: its pack index is wrong" in r.stderr and "nothing was recorded" in r.stderr
    first = checked()
    assert first >= 1
    r = server_env.cli("push", tiny["base"], "--name", "tiny")        # again: refused from memory
    assert r.returncode == 5 and "(checked before)" in r.stderr, r.stderr
    assert checked() == first
    monkeypatch.undo()
    assert "tiny" not in server_env.cli("list").stdout
    assert _ok(server_env.cli("push", tiny["base"], "--name", "tiny", "--json"))["version"] == 1   # the honest push goes through
    # what the first push found in place is not read again (the check stops at the first wrong
    # entry, so how much of the rest it had read depends on the threads' order)
    entries = sum(len(p.entries) for p in _packs(server_env, "tiny@1").packs)
    assert checked() - first <= entries - (first - 1)


def test_the_server_lends_no_pack_of_a_model_the_token_cannot_read(server_env, tiny, tmp_path):
    """Team b's push of a bundle sharing all but 4 tiny tensors with team a's model is not told
    where a's packs are: a push reuses only its own model's packs. (A
    chunk stored as a blob of its own, like the big weight, may not be shared across that line
    at all: publishing it is refused, see ``_require_readable_blobs``; so b's big weight and
    graph differ.)"""
    from tests.services_server import make_token

    _ok(server_env.cli("push", tiny["base"], "--name", "team-a", "--json"))
    b_token = make_token(server_env.db, "team-b", ["model:team-b:push", "model:team-b:pull"])
    env_b = dict(server_env.cli_env(tmp_path / "b-home"), PT2REG_TOKEN=b_token)
    from tests.fixtures_pt2 import run_cli

    r = run_cli("push", tiny["other"], "--name", "team-b", "--json", env=env_b)
    assert r.returncode == 0, r.stderr
    a_packs = {p.digest for p in _packs(server_env, "team-a@1").packs}
    b_packs = {p.digest for p in _packs(server_env, "team-b@1").packs}
    assert a_packs and b_packs and not a_packs & b_packs
    out = tmp_path / "b.pt2b"
    r = run_cli("pull", "team-b@1", "-o", out, env=env_b)
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == tiny["other"].read_bytes()
    # not even a token that may read both: a's pack holds a's other tensors too, and reusing it
    # would make it (all of it) readable by whoever may read team-c; so packs stay per model
    both = make_token(server_env.db, "both", ["model:team-*:push", "model:team-*:pull"])
    r = run_cli("push", tiny["other"], "--name", "team-c", "--json", env=dict(env_b, PT2REG_TOKEN=both))
    assert r.returncode == 0, r.stderr
    c_packs = {p.digest for p in _packs(server_env, "team-c@1").packs}
    assert c_packs and not c_packs & a_packs   # (b's pack of the same chunks is the same blob)


def test_a_client_older_than_packs_is_told_to_upgrade(server_env, tiny):
    """A client that does not say it reads packs (every pt2reg before them) asking for a chunk
    kept in a pack gets 404 with a hint to upgrade; pt2reg's client says it does."""
    import httpx

    from registry.remote.http import HttpClient

    _ok(server_env.cli("push", tiny["base"], "--name", "tiny", "--json"))
    chunk = _packs(server_env, "tiny@1").packs[0].entries[0].chunk
    auth = {"Authorization": f"Bearer {server_env.token}"}
    old = httpx.post(f"{server_env.url}/v1/blobs/download", json={"digests": [chunk]}, headers=auth)
    assert old.status_code == 404
    error = old.json()["error"]
    assert error["exit_code"] == 3 and "keeps its small tensors in packs" in error["hint"], error
    new = httpx.post(f"{server_env.url}/v1/blobs/download", json={"digests": [chunk]},
                     headers={**auth, "X-Pt2reg-Features": "packs"})
    assert new.status_code == 404 and not new.json()["error"].get("hint")
    client = HttpClient(server_env.url, server_env.token)
    try:
        assert "packs" in client._client.headers["X-Pt2reg-Features"].split(",")
    finally:
        client.close()


# -- a push to a local store names each new pack in the pass that writes it ------------------------

@pytest.fixture
def local_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """SQLite + a local directory store, in this process."""
    import os

    for var in [v for v in os.environ if v.startswith("PT2REG_")]:
        monkeypatch.delenv(var)
    monkeypatch.setenv("PT2REG_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _store_files(home: Path) -> tuple[dict[str, Path], list[str]]:
    """The local store's blobs (digest -> file) and its temp file names (those in ``tmp/`` and
    in its ``held-*`` directories, of blobs copied before their claim: they may still be there)."""
    root = home / "store"
    blobs = {"sha256:" + p.name: p for p in (root / "blobs").rglob("*") if p.is_file()}
    tmp = []
    for entry in sorted((root / "tmp").glob("*")) if (root / "tmp").is_dir() else []:
        try:
            tmp += [entry.name] if entry.is_file() else [p.name for p in entry.iterdir()]
        except FileNotFoundError:   # a held directory removed meanwhile
            pass
    return blobs, sorted(tmp)


def test_a_local_push_checks_each_small_chunk_once_and_claims_its_packs_before_they_show(
        local_home, tiny, tmp_path, monkeypatch):
    """The new packs are checked chunk by chunk and named in the one pass that writes them:
    every small chunk is hashed exactly once during the push (the plan hashes none of them).
    When their names are claimed, the packs are written (temp files named by a digest the push
    claimed first, so gc spares them) and not yet visible; afterwards each pack file hashes to
    its name and the version pulls back byte for byte."""
    import hashlib

    import registry.blobs.local as local
    import registry.client.upload as upload
    from registry.client import Registry
    from registry.format.bundle import BundleFile
    from registry.format.packs import PACK_BELOW
    from registry.store import SqlMetadataStore

    checked: list[str] = []
    for module in (local, upload):
        real = module.hash_parts

        def counting(path, fd, parts, *args, _real=real, **kwargs):
            checked.extend(p.digest for p in parts)
            return _real(path, fd, parts, *args, **kwargs)
        monkeypatch.setattr(module, "hash_parts", counting)
    seen = {}
    real_extend = SqlMetadataStore.extend_pending

    def extend(self, claim_id, digests):
        digests = list(digests)
        blobs, tmp = _store_files(local_home)
        [claim] = [c for c in self.pending_claims() if c.id == claim_id]
        seen.update(visible=set(digests) & set(blobs), tmp=tmp, claimed=claim.blobs, digests=digests)
        return real_extend(self, claim_id, digests)
    monkeypatch.setattr(SqlMetadataStore, "extend_pending", extend)

    with Registry() as reg:
        reg.push(tiny["base"], "tiny")
        pulled = reg.pull("tiny@1", tmp_path / "out.pt2b")
    assert pulled.path.read_bytes() == tiny["base"].read_bytes()
    small = {"sha256:" + sha for m in BundleFile.open(tiny["base"]).manifest.members for sha, n in m.chunks
             if n < PACK_BELOW}
    assert len(small) > TINY
    assert sorted(d for d in checked if d in small) == sorted(small)   # each once, none twice
    assert seen["digests"] and not seen["visible"]                      # claimed before shown
    named = ["sha256:" + name.split(".", 1)[0] for name in seen["tmp"]]
    assert set(named) <= set(seen["claimed"])                           # every temp file spared by gc
    members = BundleFile.open(tiny["base"]).manifest.members
    blob_names = {"sha256:" + sha for m in members for sha, _n in m.chunks} | {m.digest for m in members}
    tags = [d for d in named if d not in blob_names]                    # the packs': by the push's tag
    assert len(tags) == len(seen["digests"]) and len(set(tags)) == 1
    blobs, tmp = _store_files(local_home)
    assert not tmp
    for digest in seen["digests"]:
        assert "sha256:" + hashlib.sha256(blobs[digest].read_bytes()).hexdigest() == digest
    with SqlMetadataStore(f"sqlite:///{local_home / 'registry.db'}") as meta:
        from registry.format.packs import PackIndex
        from registry.refs import Ref

        index = PackIndex.from_json(meta.resolve(Ref.parse("tiny@1")).packs_json)
        assert {p.digest for p in index.packs} == set(seen["digests"])
        assert meta.pending_claims() == []


def test_the_large_chunks_sent_early_are_exactly_those_the_plan_stores_whole(local_home, tiny, monkeypatch):
    """The large parts of ``bundle_parts`` (sent while the plan runs) are part of what
    ``plan_upload`` stores as blobs of their own, repeats included, and nothing else; a plan that fails stops the push
    with its error, leaves no temp file and releases the claim."""
    from collections import Counter

    import registry.client.push as push
    from registry.blobs.local import LocalBlobStore
    from registry.client import Registry
    from registry.client.upload import bundle_parts, plan_upload
    from registry.format.bundle import BundleFile
    from registry.format.packs import PACK_BELOW
    from registry.store import open_metadata_store

    bundle = BundleFile.open(tiny["other"])
    with open_metadata_store(f"sqlite:///{local_home.parent / 'empty.db'}", auto_create=True) as meta:
        plan = plan_upload(bundle, meta, LocalBlobStore(local_home.parent / "s"), "m", hash_packs=False)
    early = bundle_parts(bundle)[0]
    assert early and not Counter(early) - Counter(plan.whole)
    assert all(p.size >= PACK_BELOW or p.digest in {m.digest for m in bundle.manifest.members} for p in early)

    def failing(*args, **kwargs):
        raise RuntimeError("the plan failed")
    monkeypatch.setattr(push, "plan_upload", failing)
    with Registry() as reg:
        with pytest.raises(RuntimeError, match="the plan failed"):
            reg.push(tiny["base"], "tiny")
        assert reg.meta.pending_claims() == [] and reg.meta.list_models() == []
    _blobs, tmp = _store_files(local_home)
    assert not tmp


def test_gc_while_a_push_writes_its_packs_spares_them(local_home, tiny, tmp_path, monkeypatch):
    """gc (no grace period) runs after the packs are written and before they are claimed by
    name: their temp files are named by the push's claimed tag, so gc leaves them, and the
    push publishes a version that pulls back byte for byte."""
    from registry.client import Registry
    from registry.store import SqlMetadataStore

    real_extend = SqlMetadataStore.extend_pending
    ran = []

    def extend(self, claim_id, digests):
        with Registry() as other:
            ran.append(other.gc(grace_seconds=0))
        return real_extend(self, claim_id, digests)
    monkeypatch.setattr(SqlMetadataStore, "extend_pending", extend)
    with Registry() as reg:
        reg.push(tiny["base"], "tiny")
        out = reg.pull("tiny@1", tmp_path / "out.pt2b").path
    assert ran and not ran[0].aborted_uploads
    assert out.read_bytes() == tiny["base"].read_bytes()


def test_a_push_whose_claim_was_reaped_shows_no_pack_and_records_nothing(local_home, tiny, monkeypatch):
    """gc reaped the claim of a push that looked stalled, before its packs were named: the push
    fails (exit 6, one line), renames no pack into the store, leaves no temp file, records no
    version."""
    from registry.client import Registry
    from registry.errors import ConflictError, NotFoundError
    from registry.refs import Ref
    from registry.store import SqlMetadataStore

    real_extend = SqlMetadataStore.extend_pending

    def extend(self, claim_id, digests):
        digests = list(digests)
        self.end_pending(claim_id)      # as gc does with a claim it judged dead
        seen.extend(digests)
        return real_extend(self, claim_id, digests)
    seen: list[str] = []
    monkeypatch.setattr(SqlMetadataStore, "extend_pending", extend)
    with Registry() as reg:
        with pytest.raises(ConflictError, match="lost its pending-push claim") as info:
            reg.push(tiny["base"], "tiny")
        assert info.value.exit_code == 6
        with pytest.raises(NotFoundError):
            reg.meta.resolve(Ref.parse("tiny@1"))
    blobs, tmp = _store_files(local_home)
    assert seen and not set(seen) & set(blobs) and not tmp


def test_a_small_chunk_damaged_in_the_bundle_fails_the_local_push_and_leaves_nothing(
        local_home, tiny, tmp_path):
    """A byte changed in a tiny tensor of the bundle file: the pass that writes its pack finds
    it (exit 5, naming the offset), no pack is renamed into the store (large chunks already
    committed may stay, claimed by nothing: gc's to collect), no temp file is left, no version
    recorded."""
    from registry.client import Registry
    from registry.errors import IntegrityError
    from registry.format.bundle import BundleFile
    from registry.format.packs import PACK_BELOW

    bundle = BundleFile.open(tiny["base"])
    member = next(m for m in bundle.manifest.members if m.chunks)
    start, _size = bundle.member_span(member.path)
    sha, at, n = next(s for s in member.chunk_spans()[50:] if s[2] < PACK_BELOW)
    damaged = tmp_path / "damaged.pt2b"
    data = bytearray(tiny["base"].read_bytes())
    data[start + at + n // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    with Registry() as reg:
        with pytest.raises(IntegrityError, match=f"chunk at offset {start + at} does not match") as info:
            reg.push(damaged, "tiny")
        assert info.value.exit_code == 5
        assert reg.meta.list_models() == []
    blobs, tmp = _store_files(local_home)
    assert not tmp
    assert not [d for d, p in blobs.items() if p.stat().st_size > 0 and d not in
                {"sha256:" + s for s, _n in member.chunks}], "a pack was stored"
