"""The registry service: publish, resolve, pull, lifecycle and gc over a metadata store and a
blob store. The CLI and training/inference code call this; it never hands out sessions.

    >>> reg = Registry(Settings.resolve())                                   # doctest: +SKIP
    >>> result = reg.push("model.pt2b", "team/bert", aliases=["staging"])
    >>> src = reg.materialize("team/bert@staging")        # verified files in the local cache
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Sequence

from ..format.bundle import BundleFile, write_bundle
from ..config import Settings, actor, hostname
from ..digests import digest_of_bytes
from ..errors import IntegrityError, NotFoundError, UsageError
from ..format.manifest import Manifest
from ..refs import Ref, validate_alias, validate_name
from ..pt2.reader import check_bundle_programs
from ..format.signing import check_signature_entries
from ..sources import BlobCache, MaterializedBundle
from .transfer import assemble_member, bundle_parts, upload_bundle

__all__ = ["Registry", "PushResult", "PullResult", "GcResult", "build_info"]

Progress = Callable[[int], None]
_HEARTBEAT_SECONDS = 10.0


def build_info() -> dict[str, Any]:
    """Who/when/where a bundle was built: informational, outside the bundle's identity."""
    from ..constants import VERSION as __version__

    return {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "created_by": actor(), "host": hostname(), "tool": f"pt2-registry {__version__}"}


@dataclass(frozen=True)
class PushResult:
    version: Any          # store.records.VersionRecord
    created: bool
    uploaded_bytes: int
    skipped_bytes: int
    warnings: tuple[str, ...] = ()

    @property
    def ref(self) -> str:
        return f"{self.version.name}@{self.version.number}"


@dataclass(frozen=True)
class PullResult:
    path: Path
    version: Any
    source: MaterializedBundle
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class GcResult:
    deleted: list[tuple[str, int]] = field(default_factory=list)
    kept_claimed: int = 0
    dry_run: bool = False
    aborted_uploads: list[str] = field(default_factory=list)   # digests of abandoned uploads
    released_claims: int = 0                                     # claims of dead pushes

    @property
    def reclaimed_bytes(self) -> int:
        return sum(size for _, size in self.deleted)


class _Heartbeat:
    """Keeps a pending-push claim alive while a long upload runs."""

    def __init__(self, meta: Any, pending_id: int) -> None:
        self._meta, self._id = meta, pending_id
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(_HEARTBEAT_SECONDS):
            try:
                self._meta.heartbeat_pending(self._id)
            except Exception:  # a missed heartbeat only shortens the claim; never kill the upload
                pass

    def __enter__(self) -> "_Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


class Registry:
    """One registry: metadata (SQLite/PostgreSQL) + blobs (directory/S3) + the local cache."""

    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings.resolve()

    # -- wiring ---------------------------------------------------------------------------
    @cached_property
    def meta(self) -> Any:
        from ..store import open_metadata_store

        meta = open_metadata_store(self.settings.db_url, auto_create=self.settings.embedded_db)
        self._flush_spool(meta)
        return meta

    @property
    def _spool_path(self) -> Path:
        return self.settings.home / "audit-spool.jsonl"

    def _spool_event(self, action: str, **fields: Any) -> None:
        """Record an audit event locally when serving from the cache without the database; it
        is appended to the shared audit log at the next database contact."""
        import json

        event = {"action": action, "actor": actor(), "host": hostname(),
                 "at": datetime.now(timezone.utc).isoformat(), **fields}
        self.settings.home.mkdir(parents=True, exist_ok=True)
        fd = os.open(self._spool_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, (json.dumps(event, sort_keys=True) + "\n").encode("utf-8"))
        finally:
            os.close(fd)

    def _flush_spool(self, meta: Any) -> None:
        import json

        path = self._spool_path
        if not path.exists():
            return
        claimed = path.with_name(f"{path.name}.{os.getpid()}.flushing")
        try:
            os.replace(path, claimed)
        except FileNotFoundError:
            return  # another process is flushing it
        for line in claimed.read_text("utf-8").splitlines():
            try:
                e = json.loads(line)
                meta.record_event(e["action"], actor=e["actor"], host=e["host"], model=e.get("model"),
                                  number=e.get("number"), digest=e.get("digest"), ref=e.get("ref"),
                                  details={"served_from_cache_at": e.get("at")})
            except (ValueError, KeyError, TypeError):
                continue  # a torn last line from a killed process: nothing to record
        claimed.unlink()

    @cached_property
    def blobs(self) -> Any:
        from ..blobs import open_blob_store

        return open_blob_store(self.settings.store_url)

    @cached_property
    def cache(self) -> BlobCache:
        return BlobCache(self.settings.cache_dir)

    # -- publish --------------------------------------------------------------------------
    def push(self, bundle_path: str | os.PathLike, name: str, *, aliases: Sequence[str] = (),
             lineage: Sequence[dict[str, Any]] = (), signatures: Sequence[dict[str, Any]] = (),
             environment: dict[str, Any] | None = None, progress: Progress | None = None) -> PushResult:
        """Upload every blob, then record the version, aliases, lineage and audit in one transaction."""
        validate_name(name)
        for a in aliases:
            validate_alias(a)
        bundle = BundleFile.open(bundle_path)
        manifest = bundle.manifest
        sigs = check_signature_entries(manifest.digest, [*bundle.signatures, *signatures])
        check_bundle_programs(bundle)  # torch will only ever read what the loader can vet
        parts = bundle_parts(bundle)
        pending = self.meta.begin_pending(sorted({p.digest for p in parts} | {manifest.digest}),
                                          host=hostname(), pid=os.getpid())
        try:
            with _Heartbeat(self.meta, pending):
                uploaded, skipped = upload_bundle(bundle, self.blobs, progress)
                self.blobs.put_bytes(manifest.canonical, manifest.digest)
                stored = sorted({(p.digest, p.size) for p in parts})
                version, created = self.meta.publish(
                    name, manifest.digest, manifest.canonical.decode("utf-8"), manifest.total_size,
                    stored + [(manifest.digest, len(manifest.canonical))],
                    aliases=list(aliases), metadata=dict(manifest.metadata), build=bundle.build,
                    lineage=list(lineage), signatures=sigs, actor=actor(), host=hostname(),
                    environment=environment, claim=pending, missing_blobs=self._missing_blobs)
        finally:
            self.meta.end_pending(pending)
        warnings = () if created else (f"identical content is already {version.name}@{version.number}; "
                                       f"no new version was created",)
        return PushResult(version, created, uploaded, skipped, warnings)

    def _missing_blobs(self, digests: list[str]) -> list[str]:
        """The digests the blob store lacks (stat / HEAD, several at once), in order."""
        from ..blobs.base import run_parallel

        present = run_parallel(self.blobs.exists, digests, 8) if digests else []
        return [d for d, ok in zip(digests, present) if not ok]

    # -- resolve and pull -----------------------------------------------------------------
    def resolve(self, ref: str | Ref) -> Any:
        return self.meta.resolve(ref if isinstance(ref, Ref) else Ref.parse(ref))

    def _cached_pinned(self, ref: Ref) -> MaterializedBundle | None:
        """A digest-pinned ref whose manifest and blobs are all cached: no DB, no store."""
        if ref.digest is None or not self.cache.has(ref.digest):
            return None
        if ref.name not in self._cached_names(ref.digest):
            return None  # never resolved under this model name here: the database decides
        data = self.cache.path(ref.digest).read_bytes()
        if digest_of_bytes(data) != ref.digest:
            self.cache.evict(ref.digest)
            return None
        manifest = Manifest.from_bytes(data)
        files = {}
        for m in manifest.members:
            if not self.cache.usable(m.digest):  # a damaged entry is evicted: fetched again
                return None
            files[m.path] = self.cache.path(m.digest)
        return MaterializedBundle(manifest, files, self._cached_signatures(ref.digest), label=str(ref),
                                  name=ref.name)

    def _cache_doc_path(self, kind: str, digest: str) -> Path:
        """``cache/<kind>/<hex>.json``: what this machine learnt about a digest from the database."""
        return self.settings.cache_dir / kind / f"{digest.split(':', 1)[1]}.json"

    def _read_cache_list(self, kind: str, digest: str) -> list[Any]:
        import json

        try:
            value = json.loads(self._cache_doc_path(kind, digest).read_text("utf-8"))
        except (OSError, ValueError):
            return []
        return value if isinstance(value, list) else []

    def _write_cache_doc(self, kind: str, digest: str, value: Any) -> None:
        import json

        from ..atomic import atomic_write

        with atomic_write(self._cache_doc_path(kind, digest), fsync=False) as f:
            f.write(json.dumps(value).encode("utf-8"))

    def _cached_signatures(self, digest: str) -> list[dict[str, Any]]:
        """Signatures seen for a digest (they are verified cryptographically when required)."""
        return [s for s in self._read_cache_list("signatures", digest) if isinstance(s, dict)]

    def _cache_signatures(self, digest: str, sigs: list[dict[str, Any]]) -> None:
        self._write_cache_doc("signatures", digest, sigs)

    def _cached_names(self, digest: str) -> set[str]:
        """Model names the database resolved this digest under on this machine."""
        return {n for n in self._read_cache_list("names", digest) if isinstance(n, str)}

    def _cache_name(self, digest: str, name: str) -> None:
        names = self._cached_names(digest)
        if name not in names:
            self._write_cache_doc("names", digest, sorted(names | {name}))

    @cached_property
    def trust_policy(self) -> Any:
        """The client trust policy (``HOME/trust.toml`` or ``PT2REG_TRUST``; see registry.client.trust)."""
        from .trust import load_policy

        return load_policy(self.settings.home)

    def _trusted(self, src: MaterializedBundle, trust: bool) -> MaterializedBundle:
        if not trust:
            return src
        from .trust import establish_trust

        return establish_trust(src, self.trust_policy)

    def materialize(self, ref: str | Ref, *, progress: Progress | None = None,
                    record: str | None = "pull", trust: bool = True) -> MaterializedBundle:
        """Resolve ``ref`` and make every member a verified file in the local cache.

        With ``trust`` (the default) the trust policy is enforced first: a model a rule names
        must carry a valid signature by one of its keys (SignatureError, exit 5, before any blob
        is fetched); the result's ``trusted_signers`` lists the trusted keys that signed it.
        """
        parsed = ref if isinstance(ref, Ref) else Ref.parse(ref)
        cached = self._cached_pinned(parsed)
        if cached is not None:
            cached = self._trusted(cached, trust)
            if record and "meta" in self.__dict__:  # the database is open anyway: record now
                self.meta.record_event(record, actor=actor(), host=hostname(), model=parsed.name,
                                       digest=parsed.digest, ref=str(parsed))
            elif record:
                self._spool_event(record, model=parsed.name, digest=parsed.digest, ref=str(parsed))
            return cached
        version = self.meta.resolve(parsed)
        manifest = Manifest.from_bytes(version.manifest_json.encode("utf-8"))
        if manifest.digest != version.digest:
            raise IntegrityError(f"{version.name}@{version.number}: stored manifest does not match "
                                 f"its digest {version.digest}", hint="the metadata database was altered")
        sigs = [s if isinstance(s, dict) else s.to_json() for s in self.meta.signatures(version.name, version.number)]
        label = f"{version.name}@{version.number}"
        # the trust policy needs only the digest and signatures: refuse before fetching anything
        signers = self._trusted(MaterializedBundle(manifest, {}, sigs, label=label, name=version.name,
                                                   version=version.number), trust).trusted_signers
        files = {}
        for m in manifest.members:
            path = self.cache.path(m.digest)
            if not self.cache.usable(m.digest):
                path.parent.mkdir(parents=True, exist_ok=True)
                if m.chunks:
                    self._assemble(m, path, progress)
                else:
                    self.blobs.get_file(m.digest, path, progress=progress)
                os.chmod(path, 0o444)
                self.cache.stamp(m.digest)
            elif progress:
                progress(m.size)
            files[m.path] = path
        if not self.cache.has(manifest.digest):
            import io

            self.cache.put_stream(manifest.digest, io.BytesIO(manifest.canonical))
        self._cache_signatures(version.digest, sigs)
        self._cache_name(version.digest, version.name)
        if record:
            self.meta.record_event(record, actor=actor(), host=hostname(), model=version.name,
                                   number=version.number, digest=version.digest, ref=str(parsed))
        return MaterializedBundle(manifest, files, sigs, label=label, name=version.name,
                                  version=version.number, trusted_signers=signers)

    def _assemble(self, member: Any, dest: Path, progress: Progress | None) -> None:
        assemble_member(member, self.blobs, dest, progress)

    def pull(self, ref: str, out: str | os.PathLike, *, progress: Progress | None = None,
             require_signature: Sequence[str] = ()) -> PullResult:
        """Rebuild the bundle file for ``ref`` at ``out``, verifying every member on the way.

        With ``require_signature`` (public key paths), the version must carry a valid signature
        by one of them, checked before anything is written. The trust policy is enforced by
        ``materialize`` first (exit 5 naming the model and the missing signer).
        """
        parsed = Ref.parse(ref)
        src = self.materialize(parsed, progress=progress)
        # the version the bytes came from (a cached pinned ref: look its number up by digest)
        version = self.meta.resolve(Ref(parsed.name, version=src.version) if src.version
                                    else Ref(parsed.name, digest=src.digest))
        if require_signature:
            from ..format.signing import require_signature as check

            check(src, require_signature)
        build = self.meta.build_info(version.name, version.number) if hasattr(self.meta, "build_info") else None
        sources = {path: (lambda p=p: open(p, "rb")) for path, p in src.files.items()}
        write_bundle(out, src.manifest, sources, build=build, signatures=src.signatures or None)
        warnings = []
        if version.status == "yanked":
            warnings.append(f"{version.name}@{version.number} is yanked: {version.status_reason}")
        elif version.status == "deprecated":
            warnings.append(f"{version.name}@{version.number} is deprecated: {version.status_reason}")
        return PullResult(Path(out), version, src, tuple(warnings))

    # -- lifecycle ------------------------------------------------------------------------
    def list_models(self) -> list[Any]:
        return self.meta.list_models()

    def list_versions(self, name: str) -> list[Any]:
        return self.meta.list_versions(validate_name(name))

    def set_alias(self, name: str, alias: str, ref: str) -> Any:
        validate_alias(alias)
        text = ref if "@" in ref or ref.startswith(name) else f"{name}@{ref}"
        target = self.meta.resolve(Ref.parse(text))
        if target.name != name:
            raise UsageError(f"alias {alias!r} of {name!r} cannot point at {target.name}@{target.number}")
        return self.meta.set_alias(name, alias, target.number, actor=actor(), host=hostname(),
                                   ref_for_audit=text)

    def remove_alias(self, name: str, alias: str) -> None:
        self.meta.remove_alias(validate_name(name), alias, actor=actor(), host=hostname(),
                               ref_for_audit=f"{name}@{alias}")

    def set_status(self, ref: str, status: str, reason: str) -> Any:
        if not reason.strip():
            raise UsageError("a reason is required", hint="pass --reason TEXT")
        version = self.meta.resolve(Ref.parse(ref))
        return self.meta.set_status(version.name, version.number, status, reason,
                                    actor=actor(), host=hostname(), ref_for_audit=ref)

    def show(self, ref: str, *, at: str | None = None) -> Any:
        """A version; with ``at`` (ISO 8601) and an alias ref, the version the alias held then."""
        parsed = Ref.parse(ref)
        if at is None:
            return self.meta.resolve(parsed)
        if parsed.alias is None:
            raise UsageError("--at needs an alias ref such as NAME@prod",
                             hint="versions and digests never change, so they need no time")
        when = parse_time(at)
        number = self.meta.alias_at(parsed.name, parsed.alias, when)
        if number is None:
            raise NotFoundError(f"alias {parsed.name}@{parsed.alias} did not point anywhere at {at}",
                                what="alias", name=str(parsed))
        return self.meta.resolve(Ref(parsed.name, version=number))

    # -- lineage and audit ----------------------------------------------------------------
    def lineage(self, ref: str, *, descendants: bool = False) -> tuple[Any, list[Any]]:
        v = self.meta.resolve(Ref.parse(ref))
        walk = self.meta.descendants if descendants else self.meta.ancestors
        return v, walk(v.name, v.number)

    def dataset_lineage(self, uri: str) -> list[Any]:
        from .provenance import parse_dataset

        uri, digest = parse_dataset(uri)
        return self.meta.versions_from_dataset(uri, digest=digest)

    def audit_events(self, *, model: str | None = None, since: str | None = None) -> list[Any]:
        return self.meta.events(model=validate_name(model) if model else None,
                                since=parse_time(since) if since else None)

    def verify_audit(self) -> Any:
        """Re-walk the chain and replay it against the registry's state, then check it still
        holds the newest event this machine saw at its last verification (``audit_anchor``),
        and anchor the newest event now."""
        from ..store import audit_anchor

        verdict = self.meta.verify_audit_chain()
        if not verdict.ok:
            return verdict
        contents = self.meta.verify_version_contents()
        if contents is not None:
            return contents
        path = self.settings.home / audit_anchor.ANCHOR_FILE
        anchors = audit_anchor.load(path)
        key = audit_anchor.anchor_key(self.settings.db_url)
        previous = anchors.get(key)
        head, found = self.meta.audit_hashes([int(previous["seq"])] if previous else [])
        failed = audit_anchor.check(previous, found, str(path))
        if failed is not None:
            return failed
        if head is not None:
            audit_anchor.save(path, anchors, key, head)
        return verdict

    # -- garbage collection ---------------------------------------------------------------
    def gc(self, *, dry_run: bool = False, grace_seconds: float = 0.0) -> GcResult:
        """Delete blobs no version references and no live push has claimed; abort the uploads
        that dead pushes left half done (local tmp files, S3 multipart uploads) and release
        their claims."""
        listed = list(self.blobs.list())
        referenced = self.meta.referenced_blobs()
        claims = self.meta.pending_claims()
        db_now = self.meta.db_now()  # claims are judged by the database's clock, not ours
        protected = set()
        dead = []
        for claim in claims:
            if _claim_alive(claim, db_now):
                protected.update(claim.blobs)
            else:
                dead.append(claim.id)
        now = time.time()
        deleted, kept = [], 0
        for blob in listed:
            if blob.digest in referenced:
                continue
            if blob.digest in protected or now - blob.mtime < grace_seconds:
                kept += 1
                continue
            deleted.append((blob.digest, blob.size))
        aborted: list[str] = []
        abort = getattr(self.blobs, "abort_stale_uploads", None)
        if abort is not None:
            # claims are read again after the store has listed its uploads, so a push that
            # started meanwhile (it claims before it writes) is spared
            aborted = abort(grace_seconds, dry_run=dry_run, keep=lambda: {
                d for c in self.meta.pending_claims() if _claim_alive(c, self.meta.db_now())
                for d in c.blobs})
        if not dry_run:
            # under the lock push claims take: claims and references are re-read there, so a
            # push that starts now either is seen (its blobs spared) or finds them gone; the
            # claims judged dead there are deleted there too, before any blob, so their push
            # fails at publish instead of recording a version whose blobs are gone
            released: list[int] = []
            deleted = self.meta.sweep_blobs(deleted, is_alive=_claim_alive, delete=self.blobs.delete,
                                            actor=actor(), host=hostname(), released=released)
            dead = released
        return GcResult(deleted, kept, dry_run, aborted, len(dead))


def parse_time(text: str) -> datetime:
    """ISO 8601 (``2026-11-22T10:00:00Z``, a date, or with an offset) -> aware UTC datetime."""
    try:
        when = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError as exc:
        raise UsageError(f"invalid time {text!r}", hint="use ISO 8601, e.g. 2026-11-22T10:00:00Z") from exc
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc)


def _claim_alive(claim: Any, now: datetime | None = None) -> bool:
    """A pending push is alive if its process runs here, or it heartbeated recently elsewhere.

    ``now`` is the database's clock (heartbeats are stamped by it, so a client with a skewed
    clock can neither keep a dead claim alive nor make a live one look stale)."""
    if claim.host == hostname():
        try:
            os.kill(int(claim.pid), 0)
            return True
        except (ProcessLookupError, ValueError):
            return False
        except PermissionError:
            return True
    beat = claim.heartbeat_at
    if isinstance(beat, str):
        beat = datetime.fromisoformat(beat.replace("Z", "+00:00"))
    if now is None:
        now = datetime.now(timezone.utc)
    return (now - beat).total_seconds() < 6 * _HEARTBEAT_SECONDS
