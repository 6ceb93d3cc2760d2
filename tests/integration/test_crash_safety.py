"""Issue 6, point 4: a push killed with SIGKILL at any moment never leaves a half-published
version, never blocks the next push, and leaves nothing ``gc`` cannot reclaim.

One campaign per backend. On the real S3-compatible server (SeaweedFS, on PostgreSQL: the
integration tier) the bundles are ~50 MiB and their three largest blobs (25, 10 and 10 MiB) go
up in multipart parts, the threshold lowered to 9 MiB (``PT2REG_S3_MULTIPART_THRESHOLD``), so a
kill lands inside uploads as often as on full-size bundles. On the local directory store
(SQLite) the campaign is full size (``slow``): ~107 MiB bundles (``tests.big_bundle``: 11 stored
blobs, one of 66 MiB), since that store writes so fast that small bundles leave too short an
upload for kills to land in (measured: 2 of 8). Each round pushes a fresh bundle and
kills ``pt2reg push`` (a real process) with SIGKILL at a moment drawn by a seeded RNG,
stratified over the whole push as measured on an uninterrupted one (start-up and claim,
uploads, manifest, publish); one round instead waits until the large blob is half written (a
partial tmp file, or a multipart upload with parts) and kills it then. After every kill:

* ``list m --json`` shows only versions whose content is complete in the store, and every
  version not yet checked pulls (``pull m@N``, every blob verified) and passes ``inspect``;
* the store shows no partial blob: every blob present has a known digest and its full size,
  and the only leftovers are the store's own upload scratch (``tmp/`` files, multipart uploads);
* pushing the same bundle again succeeds (resuming: blobs already stored are skipped).

At the end ``gc`` (no grace) leaves exactly the blobs the versions reference, aborts the
abandoned uploads, and the audit chain verifies.
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from registry.constants import ENV_S3_MULTIPART_THRESHOLD
from registry.format.bundle import BundleFile
from tests.big_bundle import BigBundles
from tests.fixtures_pt2 import ROOT, run_cli
from tests.fixtures_registry import RegistryEnv

KILLS = int(os.environ.get("PT2REG_TEST_KILLS", "8"))
SEED = 6_2026_11_22
POLL = 0.01
MiB = 1024 * 1024
#: the S3 campaign: a 2560 x 2560 layer (25 MiB, 4 parts of up to 8 MiB) and the 1024 x 2560
#: layers on either side of it (10 MiB, 2 parts) go up in multipart parts; the 4 MiB layer
#: and the small members below the lowered threshold do not
SMALL_HIDDEN = 2560
SMALL_THRESHOLD = 9 * MiB


def _stored_parts(bundle: BundleFile) -> dict[str, int]:
    """digest -> size of every blob the registry stores for ``bundle`` whatever it stored
    before: one per chunk of 64 KiB or more, one per unchunked member, and the manifest. (The
    small chunks go into packs, whose digests depend on what the store held: see ``check``.)"""
    from registry.format.packs import PACK_BELOW

    parts = {bundle.manifest.digest: len(bundle.manifest.canonical)}
    for m in bundle.manifest.members:
        if m.chunks:
            parts.update({"sha256:" + sha: size for sha, size in m.chunks if size >= PACK_BELOW})
        else:
            parts[m.digest] = m.size
    return parts


@dataclass
class StoreView:
    """Everything the store holds, read behind the registry's back."""

    blobs: dict[str, int]                 # digest -> size of complete-looking blob objects/files
    leftovers: dict[str, int]             # digest -> count of upload scratch (tmp files, multipart uploads)
    junk: list[str] = field(default_factory=list)      # anything else: must stay empty


class Inspector:
    """Reads a registry's blob store directly (files or S3 API), never through the registry."""

    def __init__(self, reg: RegistryEnv) -> None:
        self.reg = reg
        if reg.store.startswith("file://"):
            self.root = Path(reg.store[len("file://"):])
            self.s3 = None
        else:
            self.bucket, _, prefix = reg.store[len("s3://"):].partition("/")
            self.top = f"{prefix}/blobs/sha256/" if prefix else "blobs/sha256/"
            self.s3 = reg.s3_client()

    def view(self) -> StoreView:
        return self._s3_view() if self.s3 else self._local_view()

    def _local_view(self) -> StoreView:
        out = StoreView({}, {})
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            rel = path.relative_to(self.root).as_posix()
            parts = rel.split("/")
            # a temp file: an upload's, or one of a push that had not claimed it (tmp/held-*/)
            if parts[0] == "tmp" and (len(parts) == 2 or (len(parts) == 3 and parts[1].startswith("held-"))):
                digest = "sha256:" + parts[-1].split(".", 1)[0]
                out.leftovers[digest] = out.leftovers.get(digest, 0) + 1
            elif len(parts) == 4 and parts[:2] == ["blobs", "sha256"] and parts[2] == parts[3][:2]:
                out.blobs["sha256:" + parts[3]] = path.stat().st_size
            else:
                out.junk.append(rel)
        return out

    def _s3_view(self) -> StoreView:
        out = StoreView({}, {})
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket):
            for obj in page.get("Contents", ()):
                key = obj["Key"]
                rest = key[len(self.top):].split("/") if key.startswith(self.top) else []
                if len(rest) == 2 and rest[0] == rest[1][:2]:
                    out.blobs["sha256:" + rest[1]] = obj["Size"]
                else:
                    out.junk.append(key)
        for upload in self.uploads():
            digest = "sha256:" + upload["Key"].rsplit("/", 1)[-1]
            out.leftovers[digest] = out.leftovers.get(digest, 0) + 1
        return out

    def read(self, digest: str) -> bytes:
        """A stored blob's bytes."""
        hexd = digest[7:]
        if self.s3 is None:
            return (self.root / "blobs" / "sha256" / hexd[:2] / hexd).read_bytes()
        return self.s3.get_object(Bucket=self.bucket, Key=f"{self.top}{hexd[:2]}/{hexd}")["Body"].read()

    def uploads(self) -> list[dict]:
        pages = self.s3.get_paginator("list_multipart_uploads").paginate(Bucket=self.bucket)
        return [u for page in pages for u in page.get("Uploads", ())]

    def upload_in_progress(self, digest: str, size: int) -> bool:
        """True when ``digest`` is half uploaded: some bytes written, not all."""
        if self.s3 is None:
            return any(_partly_written(path) for path in (self.root / "tmp").glob(digest[7:] + ".*"))
        for upload in self.uploads():
            if upload["Key"].endswith(digest[7:]):
                parts = self.s3.list_parts(Bucket=self.bucket, Key=upload["Key"],
                                           UploadId=upload["UploadId"]).get("Parts", [])
                if parts:
                    return True
        return False

    def went_up_in_parts(self, digest: str) -> bool:
        """Whether S3 stored ``digest`` from a multipart upload (its ETag ends in ``-PARTS``)."""
        key = f"{self.top}{digest[7:9]}/{digest[7:]}"
        return "-" in self.s3.head_object(Bucket=self.bucket, Key=key)["ETag"]

    def progress_marker(self) -> tuple[int, int]:
        """(blobs stored, uploads in flight): changes as soon as a push starts writing."""
        if self.s3 is None:
            blobs = sum(1 for _ in (self.root / "blobs").glob("sha256/*/*"))
            return blobs, sum(1 for _ in (self.root / "tmp").glob("*"))
        listing = self.s3.list_objects_v2(Bucket=self.bucket, Prefix=self.top)
        return listing.get("KeyCount", 0), len(self.uploads())


def _partly_written(path: Path, samples: int = 16) -> bool:
    """Whether some of ``path``'s pages already hold data and some are still zeros. The local
    store gives a temp file its whole size first (``posix_fallocate``) and then fills it, so its
    size says nothing; the blob (weights) has no page of zeros."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            seen = set()
            for i in range(samples):
                f.seek(i * size // samples)
                seen.add(any(f.read(4096)))
            return seen == {True, False}
    except FileNotFoundError:   # renamed into place, or removed, meanwhile
        return False


@dataclass
class Kill:
    """When to kill one push: ``delay`` seconds after the process starts (``anchor="spawn"``),
    after its first blob write shows up in the store (``"upload"``), or as soon as the
    largest blob is half written (``"half-written"``)."""

    anchor: str
    delay: float = 0.0
    round: int = 0
    after: float = 0.0   # seconds after spawn it really happened
    outcome: str = ""    # before-upload / mid-upload / uploaded-unpublished / published / exited
    committed: int = 0   # blobs of the push visible in the store after the kill

    @property
    def label(self) -> str:
        if self.anchor == "half-written":
            return "half-written big blob"
        return f"{self.anchor} + {self.delay:.2f}s"


class _Timer:
    def __init__(self, sink: dict[str, float], name: str) -> None:
        self.sink, self.name = sink, name

    def __enter__(self) -> None:
        self.start = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.sink[self.name] = self.sink.get(self.name, 0.0) + time.monotonic() - self.start


class Campaign:
    def __init__(self, reg: RegistryEnv, factory: BigBundles, tmp: Path,
                 env: dict[str, str] | None = None) -> None:
        self.reg, self.factory, self.tmp = reg, factory, tmp
        self.extra_env = dict(env or {})         # for every command, killed or not
        self.store = Inspector(reg)
        self.sizes: dict[str, int] = {}           # every blob any bundle of ours may store
        self.versions: dict[int, dict[str, int]] = {}   # version -> its stored parts (checked)
        self.manifests: dict[str, dict[str, int]] = {}  # bundle digest -> its stored parts
        self.kills: list[Kill] = []
        self.committed = 0                        # blobs the last judged kill left visible
        self.seconds: dict[str, float] = {}
        self.tiny = BigBundles(tmp / "tiny", hidden=64, small=1)
        self.env = {**os.environ, **reg.cli_env(), **self.extra_env, "PYTHONPATH": str(ROOT)}

    # -- bundles -------------------------------------------------------------------------------
    def timer(self, name: str) -> _Timer:
        return _Timer(self.seconds, name)

    def bundle(self, variant: int, *, tiny: bool = False) -> tuple[Path, BundleFile]:
        """Variant ``variant`` of the big bundle, or of a tiny one."""
        with self.timer("build bundles"):
            factory = self.tiny if tiny else self.factory
            path = factory.make(variant, self.tmp / f"{'tiny' if tiny else 'big'}-{variant}.pt2b")
        bundle = BundleFile.open(path)
        parts = _stored_parts(bundle)
        self.sizes.update(parts)
        self.manifests[bundle.digest] = parts
        return path, bundle

    # -- pushing -------------------------------------------------------------------------------
    def spawn_push(self, path: Path) -> subprocess.Popen:
        """``pt2reg push`` as a real process: the one that is killed."""
        return subprocess.Popen([sys.executable, "-m", "registry.cli", "push", str(path), "--name", "m"],
                                env=self.env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)

    def timed_push(self, path: Path) -> tuple[float, float]:
        """An uninterrupted push: (seconds until its first upload showed, seconds in all)."""
        initial = self.store.progress_marker()
        start = time.monotonic()
        proc = self.spawn_push(path)
        first = None
        while proc.poll() is None:
            if first is None and self.store.progress_marker() != initial:
                first = time.monotonic() - start
            time.sleep(POLL)
        out, err = proc.communicate()
        assert proc.returncode == 0, err
        total = time.monotonic() - start
        return (first if first is not None else total / 2), total

    def killed_push(self, kill: Kill, path: Path, big: tuple[str, int]) -> None:
        initial = self.store.progress_marker()
        start = time.monotonic()
        proc = self.spawn_push(path)
        try:
            deadline, fire = start + 120, None
            if kill.anchor == "spawn":
                fire = start + kill.delay
            while proc.poll() is None and time.monotonic() < deadline:
                now = time.monotonic()
                if fire is not None:
                    if now >= fire:
                        break
                elif kill.anchor == "upload":
                    if self.store.progress_marker() != initial:
                        fire = now + kill.delay
                        continue
                elif self.store.upload_in_progress(*big):
                    break
                time.sleep(POLL if fire is None else min(POLL, max(0.0, fire - now)))
            kill.after = time.monotonic() - start
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
                _out, err = proc.communicate(timeout=30)
                if proc.returncode == 0:  # it finished between poll() and the kill: no kill landed
                    kill.outcome = "exited"
                else:
                    assert proc.returncode == -signal.SIGKILL, err
            else:
                kill.outcome = "exited"
                _out, err = proc.communicate()
                assert proc.returncode == 0, err
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    # -- checks --------------------------------------------------------------------------------
    def cli(self, *args: str, home: Path | None = None):
        """Every other command (checks, the next push, gc) runs in the test process."""
        r = run_cli(*args, env={**self.reg.cli_env(home), **self.extra_env})
        assert "Traceback" not in r.stderr, r.stderr
        return r

    def listed(self) -> dict[int, str]:
        r = self.cli("list", "m", "--json")
        assert r.returncode == 0, r.stderr
        return {v["version"]: v["digest"] for v in json.loads(r.stdout)["versions"]}

    def check(self, label: str) -> StoreView:
        """The registry is consistent: listed versions are complete and pull; no partial blob."""
        listed = self.last_listed = self.listed()
        assert sorted(listed) == list(range(1, len(listed) + 1)), (label, listed)
        view = self.store.view()
        assert not view.junk, (label, view.junk)
        for digest, size in view.blobs.items():  # nothing half written is visible as a blob
            if digest not in self.sizes:  # a pack: whole, if it hashes to its name
                data = self.store.read(digest)
                assert len(data) == size and "sha256:" + hashlib.sha256(data).hexdigest() == digest, (label, digest)
                continue
            assert self.sizes.get(digest) == size, (label, digest, size, self.sizes.get(digest))
        for number, digest in listed.items():
            assert digest in self.manifests, (label, number, digest)
            parts = {**self.manifests[digest], **self._packs(number)}
            missing = {d for d, s in parts.items() if view.blobs.get(d) != s}
            assert not missing, (label, f"m@{number} is listed but its blobs are not all stored", missing)
            if number in self.versions:
                continue
            out = self.tmp / f"pulled-{number}.pt2b"
            r = self.cli("pull", f"m@{number}", "-o", str(out))
            assert r.returncode == 0, (label, r.stderr)
            assert self.cli("inspect", str(out)).returncode == 0
            pulled = BundleFile.open(out)
            pulled.verify()
            assert pulled.digest == digest
            out.unlink()
            self.versions[number] = parts
        return view

    def _packs(self, number: int) -> dict[str, int]:
        """The packs version ``number`` reads its small chunks from (its pack index)."""
        from registry.format.packs import pack_blobs
        from registry.refs import Ref
        from registry.store import SqlMetadataStore

        with SqlMetadataStore(self.reg.db) as meta:
            return dict(pack_blobs(meta.resolve(Ref.parse(f"m@{number}")).packs_json))

    def outcome(self, bundle: BundleFile, before: StoreView, after: StoreView) -> str:
        """Where the kill landed, judged from what it left behind (``after``: the last check)."""
        if bundle.digest in self.last_listed.values():
            return "published"
        parts = self.manifests[bundle.digest]
        new = [d for d in parts if d not in before.blobs and d != bundle.digest]
        stored = [d for d in new if d in after.blobs]
        self.committed = len(stored)
        scratch = any(after.leftovers.get(d, 0) > before.leftovers.get(d, 0) for d in parts)
        if scratch or 0 < len(stored) < len(new):
            return "mid-upload"
        return "uploaded-unpublished" if stored else "before-upload"


def _plans(rng: random.Random, kills: int, first: float, total: float) -> list[Kill]:
    """``kills`` kill moments: a quarter during start-up (imports, claim, hashing the bundle),
    one when the big blob is half written, the rest stratified over the uploads and the
    publish (measured on an uninterrupted push: writes start at ``first``, it ends at ``total``)."""
    early = max(1, kills // 4)
    late = kills - early - 1
    plans = [Kill("spawn", first * (0.3 + 0.65 * (i + rng.random()) / early)) for i in range(early)]
    plans += [Kill("upload", 1.05 * (total - first) * (i + rng.random()) / late) for i in range(late)]
    plans.append(Kill("half-written"))
    rng.shuffle(plans)
    return plans


@pytest.mark.parametrize("reg_env", [pytest.param("team", marks=pytest.mark.integration)], indirect=True)
def test_sigkill_during_multipart_push_never_corrupts(reg_env: RegistryEnv, tmp_path: Path) -> None:
    """~50 MiB bundles on S3, their large blobs going up in multipart parts (threshold lowered)."""
    rng = random.Random(f"{SEED}-{reg_env.kind}")
    factory = BigBundles(tmp_path / "bundles", hidden=SMALL_HIDDEN, small=1)
    run = Campaign(reg_env, factory, tmp_path, {ENV_S3_MULTIPART_THRESHOLD: str(SMALL_THRESHOLD)})
    _campaign(run, rng)
    big = {d for parts in run.versions.values() for d, size in parts.items() if size > SMALL_THRESHOLD}
    assert big and all(run.store.went_up_in_parts(d) for d in big)     # the multipart path it is
    assert not any(run.store.went_up_in_parts(d) for parts in run.versions.values()
                   for d, size in parts.items() if size <= SMALL_THRESHOLD)


@pytest.mark.slow
@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_sigkill_during_full_size_push_never_corrupts(reg_env: RegistryEnv, big_bundles: BigBundles,
                                                      tmp_path: Path) -> None:
    """~107 MiB bundles on the local store (its tmp files are the half-written blobs)."""
    rng = random.Random(f"{SEED}-{reg_env.kind}")
    _campaign(Campaign(reg_env, big_bundles, tmp_path), rng)


def _campaign(run: Campaign, rng: random.Random) -> None:
    started = time.monotonic()
    for variant in (0, 1):  # uninterrupted: v1 (creates the database), v2 gives the timing to aim at
        path, _bundle = run.bundle(variant)
        first, total = run.timed_push(path)
        path.unlink()
    run.check("baseline")
    plans = _plans(rng, KILLS, first, total)

    variant = 2
    while sum(k.outcome != "exited" for k in run.kills) < KILLS and len(run.kills) < 2 * KILLS:
        kill = plans.pop() if plans else _plans(rng, KILLS, first, total)[0]
        kill.round = len(run.kills) + 1
        path, bundle = run.bundle(variant)
        big = max(run.manifests[bundle.digest].items(), key=lambda item: item[1])
        before = run.store.view()
        with run.timer("killed pushes"):
            run.killed_push(kill, path, big)
        variant += 1
        if kill.outcome == "exited" and kill.after < total:
            # the uninterrupted push was timed on a busier machine: rescale the moments left
            scale = kill.after / total
            first, total = first * scale, kill.after
            for plan in plans:
                plan.delay *= scale
        with run.timer("checks (list, pull, inspect)"):
            after = run.check(f"after kill {kill.round} ({kill.label})")
        kill.outcome = kill.outcome or run.outcome(bundle, before, after)
        run.kills.append(kill)
        if kill.anchor == "half-written" and kill.outcome != "exited":
            assert kill.outcome == "mid-upload", kill
            assert big[0] not in after.blobs    # the half-written blob is not visible
            assert after.leftovers.get(big[0]), "the interrupted upload left no scratch to clean"

        # the next push succeeds: odd rounds resume the same bundle (blobs already stored are
        # skipped); even rounds abandon it (its blobs become orphans for gc) and push another
        resume = kill.round % 2 == 1
        nxt, nxt_bundle = (path, bundle) if resume else run.bundle(kill.round, tiny=True)
        with run.timer("next pushes"):
            r = run.cli("push", str(nxt), "--name", "m", "--json")
        assert r.returncode == 0, r.stderr
        pushed = json.loads(r.stdout)
        assert pushed["digest"] == nxt_bundle.digest
        assert pushed["created"] == (not resume or kill.outcome not in ("published", "exited"))
        path.unlink()
        nxt.unlink(missing_ok=True)
    with run.timer("checks (list, pull, inspect)"):
        run.check("after the last push")

    killed = [k for k in run.kills if k.outcome != "exited"]
    outcomes = {o: sum(k.outcome == o for k in run.kills)
                for o in ("before-upload", "mid-upload", "uploaded-unpublished", "published", "exited")}
    print(f"\n[{run.reg.kind}] {len(killed)} kills in {len(run.kills)} rounds, outcomes {outcomes}; "
          f"uninterrupted push {total:.2f}s (first write at {first:.2f}s)")
    for k in run.kills:
        print(f"  round {k.round}: {k.label:<22} killed at {k.after:5.2f}s -> {k.outcome}")
    assert len(killed) >= KILLS
    assert outcomes["mid-upload"] >= KILLS // 3, outcomes    # most kills land inside the uploads

    # gc with no grace reclaims every orphan and every abandoned upload, and nothing else
    listed = run.listed()
    before_gc = run.store.view()
    with run.timer("gc"):
        r = run.cli("gc", "--json")
    assert r.returncode == 0, r.stderr
    view = run.store.view()
    referenced = {d: s for parts in run.versions.values() for d, s in parts.items()}
    assert len(run.versions) == len(listed) == len(run.kills) + 2 + sum(
        k.outcome in ("published", "exited") and k.round % 2 == 0 for k in run.kills)
    assert view.blobs == referenced, set(view.blobs) ^ set(referenced)
    orphans = set(before_gc.blobs) - set(referenced)
    assert {d["digest"] for d in json.loads(r.stdout)["deleted"]} == orphans
    print(f"  gc deleted {len(orphans)} orphan blobs; {sum(before_gc.leftovers.values())} abandoned "
          f"uploads before gc, {sum(view.leftovers.values())} after; campaign "
          f"{time.monotonic() - started:.1f}s: " + ", ".join(f"{k} {v:.1f}s" for k, v in run.seconds.items()))
    # a push killed after committing some blobs, then abandoned, left orphans for gc to find (the
    # local store commits blobs in batches: a kill before the first batch leaves only scratch)
    assert orphans or not any(k.outcome == "mid-upload" and k.round % 2 == 0 and k.committed for k in run.kills)
    assert not view.leftovers, f"gc left abandoned uploads: {view.leftovers}"
    assert not view.junk

    # after gc, versions still pull from the store itself (no cache) and verify
    bigs = [n for n, d in listed.items() if len(run.manifests[d]) > 3]
    out = run.tmp / "final.pt2b"
    for number in sorted({bigs[0], bigs[-1], rng.choice(bigs)}):
        r = run.cli("pull", f"m@{number}", "-o", str(out), home=run.tmp / f"fresh-{number}")
        assert r.returncode == 0, r.stderr
        assert BundleFile.open(out).digest == listed[number]
        BundleFile.open(out).verify()
    assert run.cli("audit", "--verify").returncode == 0


@pytest.mark.parametrize("backend", ["local", "moto", pytest.param("seaweed", marks=pytest.mark.integration)])
def test_abort_stale_uploads_spares_live_pushes(backend: str, tmp_path: Path, request: pytest.FixtureRequest):
    """The store-level cleanup gc relies on: abandoned uploads (a tmp file, a multipart upload
    with a part) are discarded unless their blob is claimed, and the claims are asked for only
    after the listing, so a push that claimed meanwhile is spared."""
    import hashlib

    from registry.blobs import S3BlobStore, open_blob_store

    blobs = {name: b"x" * 1000 + name.encode() for name in ("dead", "live", "late")}
    digests = {name: "sha256:" + hashlib.sha256(data).hexdigest() for name, data in blobs.items()}
    if backend == "local":
        store = open_blob_store(f"file://{tmp_path / 'store'}")
        (tmp_path / "store" / "tmp").mkdir(parents=True)
        for name in blobs:
            (tmp_path / "store" / "tmp" / f"{digests[name][7:]}.abc123.tmp").write_bytes(b"partial")

        def remaining() -> set[str]:
            return {"sha256:" + p.name.split(".")[0] for p in (tmp_path / "store" / "tmp").iterdir()}
    else:
        if backend == "moto":
            bucket = request.getfixturevalue("moto_s3")
            store = open_blob_store(f"s3://{bucket}/reg")
        else:
            server = request.getfixturevalue("seaweed_s3")
            bucket = server.new_bucket()
            store = S3BlobStore(f"s3://{bucket}/reg", client=server.client())
        client = store._s3()
        for name in blobs:
            key = store._key(digests[name])
            upload = client.create_multipart_upload(Bucket=bucket, Key=key)["UploadId"]
            client.upload_part(Bucket=bucket, Key=key, UploadId=upload, PartNumber=1, Body=b"partial")

        def remaining() -> set[str]:
            uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
            return {"sha256:" + u["Key"].rsplit("/", 1)[-1] for u in uploads}

        assert not list(store.list())                     # half-uploaded blobs are invisible
    assert remaining() == set(digests.values())
    if backend != "moto":  # moto reports every upload as initiated in 2010
        assert store.abort_stale_uploads(3600, keep=()) == []      # too young to judge
    asked = []

    def claims() -> set[str]:   # what gc passes: the blobs of live pushes, read when asked
        asked.append(remaining())
        return {digests["live"], digests["late"]}

    assert sorted(store.abort_stale_uploads(0, keep=claims, dry_run=True)) == [digests["dead"]]
    assert remaining() == set(digests.values())
    assert store.abort_stale_uploads(0, keep=claims) == [digests["dead"]]
    assert asked and all(a == set(digests.values()) for a in asked)   # claims read after the listing
    assert remaining() == {digests["live"], digests["late"]}
    assert sorted(store.abort_stale_uploads(0)) == sorted([digests["live"], digests["late"]])
    assert remaining() == set()
