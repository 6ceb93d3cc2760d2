"""The push protocol: claim, upload, record -- so an interrupted push never leaves a version.

1. the bundle is opened and checked (signature entries well formed, every program vetted as
   the loader will vet it, or found in this machine's verdicts: see below) before anything is
   sent;
2. the blobs it will write are *claimed* in the metadata store (gc spares claimed blobs) and
   the claim is kept alive by a heartbeat while the upload runs. To a local store the claim
   grows as the push learns what it stores, always before a blob becomes visible: first the
   large chunks and a random tag that names the temp files of new packs, then the planned
   blobs, then each new pack by name once it is written and before it is renamed in
   (``LocalBlobStore.put_packs``, ``extend_pending``). The large chunks are copied from the
   start, while the metadata store opens (a whole command's import of SQLAlchemy and its
   tables, ~0.3 s, runs under the copy), into temp files in a ``tmp/held-*`` directory that
   the push holds locked: nothing there is visible, gc leaves it alone while the lock is held
   (it dies with the process), and the files are renamed in only once the claim holds
   (``LocalBlobStore.put_parts_held``); a push that never claims discards them;
3. every blob is uploaded, each range of the file hashed against its blob's digest (a chunked
   member is its chunks; a new pack is checked chunk by chunk in the pass that writes it);
4. the version, aliases, lineage, signatures and audit event are recorded in one transaction
   that fails if gc reaped the claim meanwhile or a blob is missing; the claim is released.

``Registry.push`` is the public entry point; this module holds its body.

Vetting verdicts (``registry.pt2.verdicts``). The program check costs ~0.1 ms per tensor (a
second for 10,000 tensors), and ``pt2reg bundle`` ran it moments before on the same bytes. With
``vetted_dir`` (the client cache's, where bundle and load keep theirs), a program member with a
verdict for its identity (``Member.digest``: for a chunked member the sha256 of its chunk list),
its kind and this vetting code is not read again. That is sound because what a push publishes
is exactly that identity, whatever the file now holds: step 3 stores nothing but bytes checked
against their chunk's digest (``put_parts`` of each store hashes every range it uploads, and a
range whose blob is already stored is hashed too, ``check_range``; a chunk that does not match
fails the push with IntegrityError, exit 5, before anything is recorded), and by sha256 the
bytes with that chunk list are the bytes the verdict was reached on (by the bundler, on the
bytes it wrote and hashed; by the loader, on a verified cache file). A push reads verdicts but
writes none: it checks the file, and the file need not be what it publishes (altered between
the check and the upload, or a chunk listed twice, whose second copy the upload never reads).
Verdicts stay on this machine: no request carries one and the server reads none.
"""
from __future__ import annotations

import dataclasses
import os
import secrets
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..blobs.base import ProgressFn, as_pack_writer, locked_progress, run_parallel
from ..config import actor, hostname
from ..constants import HEARTBEAT_SECONDS
from ..errors import ConflictError
from ..format.bundle import BundleFile
from ..format.signing import check_signature_entries
from ..parallel import Background
from ..pt2.reader import check_bundle_programs
from .ports import BlobStore, MetadataStore, PublishRequest
from .upload import UploadPlan, bundle_parts, plan_upload, upload_plan

if TYPE_CHECKING:
    from ..store.records import LineageEdge, VersionRecord

__all__ = ["PushResult", "push_bundle", "HEARTBEAT_SECONDS"]



@dataclass(frozen=True)
class PushResult:
    version: VersionRecord
    created: bool
    uploaded_bytes: int
    skipped_bytes: int
    warnings: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.version.name}@{self.version.number}"


class _Heartbeat:
    """Keeps a pending-push claim alive while a long upload runs."""

    def __init__(self, meta: MetadataStore, pending_id: int) -> None:
        self._meta, self._id = meta, pending_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            try:
                self._meta.heartbeat_pending(self._id)
            except Exception:  # a missed heartbeat only shortens the claim; never kill the upload
                pass

    def start(self) -> _Heartbeat:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def push_bundle(open_meta: Callable[[], MetadataStore], blobs: BlobStore, bundle: BundleFile, name: str, *,
                aliases: Sequence[str] = (), lineage: Sequence[LineageEdge] = (),
                signatures: Sequence[Mapping[str, Any]] = (), environment: Mapping[str, Any] | None = None,
                progress: ProgressFn | None = None, vetted_dir: str | os.PathLike | None = None) -> PushResult:
    """Upload every blob of ``bundle``, then record the version (steps 1-4 above). ``name`` and
    ``aliases`` are validated by the caller; ``signatures`` are added to the bundle's own.
    ``open_meta`` opens the metadata store, once: a store that writes through temp files
    (``writes_packs``, a local directory) is already copying the large chunks by then, into
    files no one sees before the claim (``put_parts_held``), so the database's opening (and a
    command's import of it) runs under the copy. ``vetted_dir``: this machine's vetting
    verdicts (see above), read only."""
    manifest = bundle.manifest
    sigs = check_signature_entries(manifest.digest, [*bundle.signatures, *signatures])
    # torch will only ever read what the loader can vet. A member skipped on a verdict is
    # covered by the chunk verification of upload_plan below (the module docstring says why)
    check_bundle_programs(bundle, vetted_dir=vetted_dir)
    progress = locked_progress(progress)
    parts = bundle_parts(bundle)
    early = parts[0] if blobs.writes_packs else []
    claimed: Future[None] = Future()   # set once the claim holds: the early copies may then be seen
    meta: MetadataStore | None = None
    pending: int | None = None
    heartbeat: _Heartbeat | None = None
    named: list[UploadPlan] = []   # the plan with its new packs named (``claim``)
    job: Background | None = None

    def claim_more(digests: Collection[str]) -> None:
        assert meta is not None and pending is not None
        if digests and not meta.extend_pending(pending, sorted(digests)):
            raise ConflictError(f"push of {name} lost its pending-push claim while uploading: gc reaped it "
                                f"because the push stalled past its heartbeat; nothing was recorded",
                                hint="push again (it uploads whatever gc deleted)")

    def claim(packs: list[tuple[str, int]]) -> None:
        """The new packs, written and not yet visible: claimed before they are renamed in; the
        version's pack index is then written out while the store flushes the last bytes."""
        if job is not None:
            job.check()   # the large chunks failed: no pack is shown
        claim_more([d for d, _ in packs])
        assert plan is not None
        named.append(plan.named(packs))
        named[0].index.to_json()

    def unrecorded(digests: set[str]) -> set[str]:
        """Blobs no version records are (nearly always) not stored: uploaded without asking the
        store first (a HEAD per chunk on S3); a leftover copy is replaced, same bytes."""
        assert meta is not None
        recorded = meta.recorded_blobs(sorted(digests))
        return set() if recorded is None else digests - recorded

    def missing_blobs(digests: list[str]) -> list[str]:
        """The digests the blob store lacks (stat / HEAD, several at once), in order."""
        present = run_parallel(blobs.exists, digests, 8) if digests else []
        return [d for d, ok in zip(digests, present) if not ok]

    def copy_early(report: ProgressFn) -> tuple[int, int]:
        if not early:
            return 0, 0
        return as_pack_writer(blobs).put_parts_held(bundle.path, early, claimed=claimed.result, progress=report)

    def unclaimed() -> None:   # the push failed before its claim: what was copied is discarded
        claimed.cancel()

    try:
        with Background(copy_early, progress, on_stop=unclaimed) as job:   # the large chunks start now
            meta = open_meta()
            # A store that names new packs in the pass that writes them, over a metadata store
            # that extends claims, claims as the push learns what it stores: the large chunks
            # and a random tag that names the new packs' temp files first, then the planned
            # blobs, then each new pack by name (one read and hash of their chunks fewer).
            # Otherwise every blob is planned (packs hashed first) and claimed at once.
            one_pass = blobs.writes_packs and meta.extends_claims   # declared by each store's class
            plan: UploadPlan | None = None if one_pass else plan_upload(bundle, meta, blobs, name, parts=parts)
            copied = {p.digest for p in early}   # by ``copy_early``, whatever the plan
            first = copied | ({d for d, _ in plan.blobs()} if plan is not None else set())
            tag = "sha256:" + secrets.token_hex(32) if one_pass else None
            pending = meta.begin_pending(sorted(first | {manifest.digest} | ({tag} if tag else set())),
                                         host=hostname(), pid=os.getpid(), name=name)
            try:
                claimed.set_result(None)
            except InvalidStateError:   # cancelled: the copies failed meanwhile (their error is raised)
                job.check()
                raise
            heartbeat = _Heartbeat(meta, pending).start()

            def reported(n: int) -> None:   # the upload stops as soon as the large chunks failed
                job.check()
                if progress is not None:
                    progress(n)

            if plan is None:
                plan = plan_upload(bundle, meta, blobs, name, hash_packs=False, parts=parts)
                rest = {d for d, _ in plan.blobs()} - first
                job.check()
                claim_more(rest)
                new = unrecorded(rest)
            else:
                new = unrecorded(first - copied)
            later = dataclasses.replace(plan, whole=[p for p in plan.whole if p.digest not in copied])
            uploaded, skipped = upload_plan(bundle, later, blobs, reported, unrecorded=new, tag=tag, claim=claim)
        up_early, skipped_early = job.result()
        uploaded, skipped = uploaded + up_early, skipped + skipped_early
        if plan.groups:
            plan = named[0]
        stored = plan.blobs()
        blobs.put_bytes(manifest.canonical, manifest.digest)
        request = PublishRequest(
            name, manifest.digest, manifest.canonical.decode("utf-8"), manifest.total_size,
            stored + [(manifest.digest, len(manifest.canonical))],
            aliases=list(aliases), metadata=dict(manifest.metadata), build=bundle.build,
            lineage=list(lineage), signatures=sigs, environment=environment, claim=pending,
            packs=plan.index if plan.index else None)
        version, created = meta.publish(request, actor=actor(), host=hostname(), missing_blobs=missing_blobs)
    finally:
        if heartbeat is not None:
            heartbeat.stop()
        if pending is not None:
            assert meta is not None
            meta.end_pending(pending)
    warnings = () if created else (f"identical content is already {version.name}@{version.number}; "
                                   f"no new version was created",)
    return PushResult(version, created, uploaded, skipped, warnings)
