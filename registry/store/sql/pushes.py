"""``PushStore`` over SQL: pending-push claims, where chunks lie, and garbage collection."""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import delete, select, update
from sqlalchemy import delete as delete_rows
from sqlalchemy.orm import Session

from ...format.packs import ChunkLocation, PackIndex, pack_blobs
from ...refs import (
    validate_digest,
    validate_digests,
    validate_name,
)
from .. import audit_log
from .. import tokens as token_rows
from ..audit_chain import parse_ts
from ..engine import (
    in_batches,
)
from ..orm import (
    FOR_MODEL,
    UPLOADED,
    ModelRow,
    PendingPushRow,
    VersionBlobRow,
    VersionPackRow,
    VersionRow,
    db_clock,
    json_text,
    now_text,
)
from ..records import (
    GcResult,
    PendingPush,
)
from ._base import LOCATE_VERSIONS, SqlStoreBase, _audit_details, _gc_lock

if TYPE_CHECKING:
    from ...blobs.base import BlobStore

__all__ = ["SqlPushStore"]


class SqlPushStore(SqlStoreBase):
    """Push claims, chunk lookups and the gc sweep, under the gc lock."""

    #: a claim grows while a push uploads (``extend_pending``): packs are claimed as they are named
    extends_claims = True

    def gc(self, blobs: BlobStore, *, dry_run: bool, grace_seconds: float, actor: str, host: str,
           audit_details: Mapping[str, Any] | None = None) -> GcResult:
        """Collect garbage in ``blobs`` here (``registry.store.gc.collect_garbage``): blobs no
        version references and no live claim holds are swept under the gc lock, audited as
        ``gc.delete`` by ``actor``/``host`` with ``audit_details``."""
        from ..gc import collect_garbage

        return collect_garbage(self, blobs, dry_run=dry_run, grace_seconds=grace_seconds, actor=actor, host=host,
                               audit_details=audit_details)

    def begin_pending(self, blobs: Iterable[str], host: str, pid: int, *, name: str | None = None) -> int:
        """Claim blobs a publish is uploading, so gc spares them; returns the claim id.
        ``name``: the model being pushed, recorded with the claim (``PendingPush.model``: a
        server lets tokens that may push or pull it use the blobs the claim uploaded).

        For example (``store`` an open ``SqlMetadataStore``)::

            claim = store.begin_pending(["sha256:cdcd..."], "gpu-1", 4242)
        """
        entries = sorted({validate_digest(d) for d in blobs})
        if name is not None:
            entries.append(FOR_MODEL + validate_name(name))

        def work(s: Session) -> int:
            _gc_lock(s)  # a gc sweep either sees this claim or has finished deleting
            now = now_text(s)
            row = PendingPushRow(host=host, pid=pid, started_at=now, heartbeat_at=now,
                                 blobs_json=json_text(entries, "blobs"))
            s.add(row)
            s.flush()
            return row.id

        return self._write(work)

    def extend_pending(self, claim_id: int, blobs: Iterable[str]) -> bool:
        """Add blobs to a live claim (a push names its new packs only once it has written
        them, and claims them before they become visible); False when gc already reaped the
        claim (nothing is added: the push must not publish).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.extend_pending(claim, ["sha256:abab..."])   # -> True
        """
        digests = {validate_digest(d) for d in blobs}

        def work(s: Session) -> bool:
            _gc_lock(s)  # as begin_pending: a sweep either sees these blobs claimed or has finished
            row = s.get(PendingPushRow, claim_id)
            if row is None:
                return False
            row.blobs_json = json_text(sorted(digests | set(json.loads(row.blobs_json))), "blobs")
            return True

        return self._write(work)

    def record_upload(self, digest: str, *, host_prefix: str) -> list[int]:
        """Note that the holder of the claims whose host starts with ``host_prefix`` (a server's
        claims of one token) sent the bytes of ``digest``, in each of them that claims it;
        returns their ids. A server over a local directory calls this once the bytes arrived and
        matched (see ``registry.server.ownership``).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.record_upload("sha256:cdcd...", host_prefix="remote:t7:")   # -> [3]
        """
        validate_digest(digest)

        def work(s: Session) -> list[int]:
            _gc_lock(s)
            marked = []
            for row in s.scalars(select(PendingPushRow).where(
                    PendingPushRow.host.startswith(host_prefix, autoescape=True))):
                entries = json.loads(row.blobs_json)
                if digest in entries and UPLOADED + digest not in entries:
                    row.blobs_json = json_text(sorted([*entries, UPLOADED + digest]), "blobs")
                    marked.append(row.id)
            return marked

        return self._write(work)

    def heartbeat_pending(self, claim_id: int) -> bool:
        """Refresh a claim; False if it is gone (gc expired it), so the publisher knows.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.heartbeat_pending(claim)   # -> True
        """
        return self._write(lambda s: s.execute(
            update(PendingPushRow).where(PendingPushRow.id == claim_id)
            .values(heartbeat_at=now_text(s))).rowcount == 1)

    def end_pending(self, claim_id: int) -> None:
        """Release a claim (idempotent).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.end_pending(claim)
        """
        self._write(lambda s: s.execute(delete(PendingPushRow)
                                        .where(PendingPushRow.id == claim_id)))

    def db_now(self) -> datetime:
        """The database's clock now (claim liveness compares database time to database time).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.db_now().tzinfo   # -> datetime.timezone.utc
        """
        return parse_ts(self._read(db_clock))

    def pending_claims(self) -> list[PendingPush]:
        """Every open claim, oldest first; gc judges staleness by ``heartbeat_at``.

        For example (``store`` an open ``SqlMetadataStore``)::

            [p.pid for p in store.pending_claims()]   # -> [4242]
        """
        return self._read(lambda s: [row.to_record() for row in s.scalars(
            select(PendingPushRow).order_by(PendingPushRow.id))])

    def sweep_blobs(self, candidates: Iterable[tuple[str, int]], *,
                    is_alive: Callable[[PendingPush, datetime], bool],
                    delete: Callable[[str], None], actor: str, host: str,
                    released: list[int] | None = None,
                    audit_details: Mapping[str, Any] | None = None) -> list[tuple[str, int]]:
        """Delete unreferenced, unclaimed blobs under the gc lock; returns what was deleted.

        Claims and references are read again while holding the lock that ``begin_pending``
        and ``publish`` also take, so a push either claimed its blobs before this sweep (they
        are spared) or claims them after it (and then finds them gone and uploads them).
        ``is_alive(claim, now)`` judges each claim against the database's clock; the claims it
        finds dead are deleted in this same transaction, *before* any blob, so a stalled push
        whose blobs go finds its claim gone when it publishes (and records nothing), never a
        version whose blobs were swept. ``released`` is set to their ids. Each deletion
        is recorded as a ``gc.delete`` audit event in the same transaction.
        """
        from ...format.manifest import (
            stored_blobs,  # a manifest parse: loaded by gc, not by every command
        )

        wanted = list(candidates)
        extra = _audit_details(audit_details)

        def work(s: Session) -> list[tuple[str, int]]:
            _gc_lock(s, exclusive=True)
            now = parse_ts(now_text(s))
            claims = [row.to_record() for row in s.scalars(select(PendingPushRow))]
            alive = [c for c in claims if is_alive(c, now)]
            dead = sorted({c.id for c in claims} - {c.id for c in alive})
            if dead:
                s.execute(delete_rows(PendingPushRow).where(PendingPushRow.id.in_(dead)))
                s.flush()
            if released is not None:
                released[:] = dead
            live = {d for c in alive for d in c.blobs}
            referenced = set(s.scalars(select(VersionBlobRow.blob_digest).distinct()))
            # what each version's manifest (and pack index) says it needs, whatever version_blobs says
            for text_, packs_ in s.execute(select(VersionRow.manifest_json, VersionPackRow.packs_json)
                                           .outerjoin(VersionPackRow, VersionPackRow.version_id == VersionRow.id)
                                           .execution_options(yield_per=1000)):
                referenced.update(d for d, _ in stored_blobs(text_))
                referenced.update(d for d, _ in pack_blobs(packs_))  # its packs (not every entry re-checked)
            done = []
            for digest, size in wanted:
                if digest in live or digest in referenced:
                    continue
                audit_log.append_event(s, "gc.delete", actor=actor, host=host, digest=digest,
                                       details={"size": size}, extra=extra)
                delete(digest)
                done.append((digest, size))
            return done

        return self._write(work)

    def referenced_blobs(self) -> set[str]:
        """Digests of every blob some version references (gc must keep them).

        For example (``store`` an open ``SqlMetadataStore``)::

            "sha256:cdcd..." in store.referenced_blobs()   # -> True
        """
        return self._read(lambda s: set(s.scalars(select(VersionBlobRow.blob_digest)
                                                  .distinct())))

    def pullable_blob_models(self, digests: Sequence[str]) -> dict[str, set[str]]:
        """``digest -> names of the models whose versions reference it``, for each of
        ``digests`` some version references (unreferenced digests are absent); the server lets
        a token fetch a blob only when it may pull one of those models.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.pullable_blob_models(["sha256:cdcd..."])   # -> {'sha256:cdcd...': {'bert'}}
        """
        wanted = validate_digests(digests)
        return self._read(lambda s: token_rows.blob_models(s, wanted))

    def locate_chunks(self, digests: Sequence[str], *, name: str) -> dict[str, ChunkLocation]:
        """Where each of ``digests`` is stored inside a pack one of the ``LOCATE_VERSIONS``
        latest versions of model ``name`` reads (a push to it reuses the chunk instead of storing
        it again, the newest version's place first); chunks found there are absent. Only the
        model's own packs: a version's packs become readable by whoever may read the version,
        and a pack of another model, holding that model's other tensors too, is never lent
        (large chunks, blobs of their own, still dedup across models).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.locate_chunks(["sha256:abab..."], name="bert")["sha256:abab..."].pack   # -> 'sha256:cdcd...'
        """
        validate_name(name)
        wanted = set(validate_digests(digests))

        def work(s: Session) -> dict[str, ChunkLocation]:
            found: dict[str, ChunkLocation] = {}
            for (text_,) in s.execute(select(VersionPackRow.packs_json)
                                      .join(VersionRow, VersionRow.id == VersionPackRow.version_id)
                                      .join(ModelRow, ModelRow.id == VersionRow.model_id)
                                      .where(ModelRow.name == name)
                                      .order_by(VersionRow.number.desc()).limit(LOCATE_VERSIONS)):
                for chunk, loc in PackIndex.from_stored(text_).locations().items():
                    if chunk in wanted:
                        found.setdefault(chunk, loc)
            return found

        return self._read(work)

    def recorded_pack_entries(self, packs: Sequence[str]) -> set[tuple[str, str, int, int]]:
        """``(chunk, pack, offset, size)`` of the entries of ``packs`` the indexes of the
        ``LOCATE_VERSIONS`` latest versions reading them record (a server checks only the
        entries of a pushed index no recorded index vouches for)."""
        wanted = sorted({validate_digest(d) for d in packs})

        def work(s: Session) -> set[tuple[str, str, int, int]]:
            out: set[tuple[str, str, int, int]] = set()
            readers = (select(VersionBlobRow.version_id).where(VersionBlobRow.blob_digest.in_(wanted))
                       .distinct().order_by(VersionBlobRow.version_id.desc()).limit(LOCATE_VERSIONS))
            for (text_,) in s.execute(select(VersionPackRow.packs_json)
                                      .where(VersionPackRow.version_id.in_(readers.scalar_subquery()))):
                out.update((e.chunk, p.digest, e.offset, e.size) for p in PackIndex.from_stored(text_).packs
                           if p.digest in wanted for e in p.entries)
            return out

        return self._read(work)

    def recorded_blobs(self, digests: Sequence[str]) -> set[str] | None:
        """Which of ``digests`` some version records (its ``version_blobs``): a push asks the
        blob store only about these (the digests ``pullable_blob_models`` maps).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.recorded_blobs(["sha256:cdcd...", "sha256:efef..."])   # -> {'sha256:cdcd...'}
        """
        wanted = sorted(set(validate_digests(digests)))

        def work(s: Session) -> set[str]:
            found: set[str] = set()
            for among in in_batches(s, VersionBlobRow.blob_digest, wanted):
                found.update(s.scalars(select(VersionBlobRow.blob_digest).distinct().where(among)))
            return found

        return self._read(work)
