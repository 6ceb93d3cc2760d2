"""The SQL metadata store: models, versions, aliases, lineage and the audit log.

One class over SQLAlchemy 2.0 that behaves the same on SQLite and PostgreSQL. Callers get
frozen records (:mod:`registry.store.records`) and registry errors, never sessions or
SQLAlchemy exceptions. Every state change appends its audit event in the same transaction.

How concurrent writers stay correct:

- *version numbers* (gap-free per model): a publish locks its model row (PostgreSQL
  ``SELECT ... FOR UPDATE`` after an ``INSERT ... ON CONFLICT DO NOTHING``; SQLite holds the
  database write lock from ``BEGIN IMMEDIATE``) before reading ``max(number)``;
- *the audit chain* (one chain): appends take ``pg_advisory_xact_lock`` (PostgreSQL; SQLite is
  already serialized) before reading the last event's hash, always after any row lock, so lock
  order is fixed and writers cannot deadlock;
- anything that still loses a race is retried as a whole (:func:`run_transaction`).

For example::

    store = SqlMetadataStore(make_engine("sqlite:////tmp/reg/registry.db"))
    version, created = store.publish("bert", digest, manifest, 1234, [(blob, 1234)],
                                     aliases=["prod"], actor="ana", host="gpu-1")
    store.resolve(Ref.parse("bert@prod")).number   # -> 1
"""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar

from sqlalchemy import Engine, delete, func, select, update
from sqlalchemy import delete as delete_rows
from sqlalchemy.orm import Session, defer

from .audit_chain import ChainVerdict, format_ts, parse_ts
from ..errors import (NotAuthenticatedError, NotFoundError,
                      SignatureError, UsageError)
from ..format.packs import ChunkLocation, PackIndex, pack_blobs
from ..refs import Ref, validate_alias, validate_digest, validate_digests, validate_name
from ..access.scopes import Identity, parse_scope
from ..access.policy import (ROLE_SCOPES, AliasPolicy, attestation_digest, attestation_statement,
                             validate_label)
from ..format.signing import key_id_of, public_key_from_pem
from ..access.tokens import hash_secret, new_secret, validate_owner
from . import audit_log, governance, writes
from . import lineage as graph
from . import tokens as token_rows
from .engine import GC_LOCK_KEY, advisory_lock, in_batches, make_engine, run_transaction
from .orm import (STATUSES, FOR_MODEL, UPLOADED, AliasRow, AuditEventRow, ModelRow, OciArtifactRow, PendingPushRow,
                  SignatureRow, TokenRow, VersionBlobRow, VersionPackRow, VersionRow, db_clock, json_text, now_text)
from .records import (AliasRecord, AttestationRecord, AuditEvent, LineageEdge, LineageNode,
                      ModelRecord, OciArtifactRecord, PendingPush, SignatureRecord, TokenRecord, VersionRecord)

__all__ = ["SqlMetadataStore"]

T = TypeVar("T")

_STATUS_ACTIONS = {"deprecated": "deprecate", "yanked": "yank", "active": "restore"}


#: how many of a model's latest versions a push looks for its small chunks in (their pack indexes)
LOCATE_VERSIONS = 8


def _audit_details(audit_details: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """A write's ``audit_details``, checked to be JSON before any transaction opens."""
    if audit_details is None:
        return None
    extra = dict(audit_details)
    json_text(extra, "audit details")
    return extra


def _gc_lock(s: Session, *, exclusive: bool = False) -> None:
    """The gc lock: a sweep holds it exclusively; claims and publishes share it (they never
    wait for each other, only for a sweep). SQLite serializes write transactions anyway."""
    advisory_lock(s, GC_LOCK_KEY, shared=not exclusive)


class SqlMetadataStore:
    """Registry metadata in a SQL database (SQLite file or PostgreSQL).

    Takes an engine from :func:`registry.store.engine.make_engine` (or a URL) whose schema is at
    head (see :func:`registry.store.migrate.ensure_schema`); creating tables is not its job.
    """

    def __init__(self, engine: Engine | str, *, on_close: Callable[[], None] | None = None) -> None:
        self.engine = make_engine(engine) if isinstance(engine, str) else engine
        self._on_close = on_close

    def close(self) -> None:
        """Close pooled connections (the store is unusable afterwards); with ``on_close`` (an
        engine ``kept_engine`` shares), hand the engine back instead. Idempotent."""
        on_close, self._on_close = self._on_close, (lambda: None)
        if on_close is not None:
            on_close()
        else:
            self.engine.dispose()

    def __enter__(self) -> "SqlMetadataStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _read(self, work: Callable[[Session], T]) -> T:
        return run_transaction(self.engine, work, write=False)

    def _write(self, work: Callable[[Session], T]) -> T:
        return run_transaction(self.engine, work, write=True)

    # -- lookups inside a transaction -------------------------------------------------------

    def _model(self, s: Session, name: str, *, lock: bool = False) -> ModelRow:
        stmt = select(ModelRow).where(ModelRow.name == name)
        row = s.scalars(stmt.with_for_update() if lock else stmt).one_or_none()
        if row is None:
            raise NotFoundError(f"model {name!r} not found", what="model", name=name)
        return row

    def _no_version(self, s: Session, model: ModelRow, number: int) -> NotFoundError:
        latest = s.scalar(select(func.max(VersionRow.number))
                          .where(VersionRow.model_id == model.id))
        tail = f"latest is {latest}" if latest else "it has no versions"
        return NotFoundError(f"model {model.name!r} has no version {number} ({tail})",
                             what="version", name=model.name)

    def _version(self, s: Session, model: ModelRow, number: int) -> VersionRow:
        row = s.scalars(select(VersionRow).where(VersionRow.model_id == model.id,
                                                 VersionRow.number == number)).one_or_none()
        if row is None:
            raise self._no_version(s, model, number)
        return row

    def _record(self, s: Session, name: str, row: VersionRow, *, packs: bool = False) -> VersionRecord:
        """The record of ``row``; with ``packs``, its pack index too (what a pull needs)."""
        aliases = s.scalars(select(AliasRow.alias).where(AliasRow.version_id == row.id)).all()
        index = s.get(VersionPackRow, row.id) if packs else None
        return row.to_record(name, list(aliases), packs_json=index.packs_json if index is not None else None)

    def _not_found(self, s: Session, ref: Ref) -> NotFoundError:
        model = self._model(s, ref.name)
        if ref.version is not None:
            return self._no_version(s, model, ref.version)
        if ref.digest is not None:
            return NotFoundError(f"model {ref.name!r} has no version with digest {ref.digest}",
                                 what="digest", name=ref.name)
        if ref.alias is not None:
            known = s.scalars(select(AliasRow.alias).where(AliasRow.model_id == model.id)
                              .order_by(AliasRow.alias)).all()
            return NotFoundError(f"model {ref.name!r} has no alias {ref.alias!r}", what="alias",
                                 name=ref.name, hint=f"its aliases: {', '.join(known)}"
                                 if known else "it has no aliases")
        count = s.scalar(select(func.count()).select_from(VersionRow)
                         .where(VersionRow.model_id == model.id))
        message = (f"every version of model {ref.name!r} is yanked" if count
                   else f"model {ref.name!r} has no versions")
        return NotFoundError(message, what="version", name=ref.name)

    # -- publish ----------------------------------------------------------------------------

    def publish(self, name: str, digest: str, manifest_json: str, size: int,
                blobs: Iterable[tuple[str, int]], *, aliases: Iterable[str] = (),
                metadata: Mapping[str, Any] | None = None,
                build: Mapping[str, Any] | None = None,
                lineage: Iterable[LineageEdge | Mapping | tuple] = (),
                signatures: Iterable[SignatureRecord | Mapping | tuple[str, str, str]] = (),
                environment: Mapping[str, Any] | None = None,
                actor: str, host: str, ref_for_audit: str | None = None,
                claim: int | None = None,
                missing_blobs: Callable[[list[str]], list[str]] | None = None,
                audit_details: Mapping[str, Any] | None = None,
                identity: Identity | None = None, packs_json: str | None = None,
                packs: PackIndex | None = None) -> tuple[VersionRecord, bool]:
        """Insert a version (next number) with its blobs, lineage, signatures and aliases.

        ``lineage`` items are LineageEdge records or mappings with the same keys; a parent edge
        must be a version of the model its value names with its digest, of a model ``identity``
        may pull (``writes.check_parents``: NotFoundError otherwise); it is stored as
        ``name@number``. ``signatures`` are SignatureRecords or
        ``signatures.json`` entries. ``build`` and ``environment`` (python/torch/CUDA of the
        publisher) are informational JSON. ``claim`` (from :meth:`begin_pending`) must still
        exist, else ConflictError: gc reaped it because the push stalled past its heartbeat and
        may have deleted its blobs. ``missing_blobs(digests)`` returns those the blob store
        lacks (IntegrityError when any, for a new version). Both checks run inside this
        transaction under the gc lock a sweep holds exclusively, so either the sweep saw the
        claim alive (and spared the blobs) or this publish sees it reaped; nothing is recorded
        then. Returns ``(version, created)``. Identical content (same digest) already in the model
        returns the existing version with ``created=False``; requested aliases (and new
        signatures) are still applied. All in one transaction, audited; ``audit_details`` (here
        and on every write) are added to each event's details (the server records its token id).
        ``packs_json``: the version's pack index (``format.packs``: where its small chunks lie in
        pack blobs; ``blobs`` then names the packs, not those chunks), recorded with the version
        (``locate_chunks`` reads it back). It is taken as given: a server checks a client's index
        against the packs' bytes before calling this. ``packs``: the same, parsed already (a
        push in this process: its 10,000 entries are not written out and read back).

        For example (``store`` an open ``SqlMetadataStore``)::

            v, created = store.publish("bert", "sha256:" + "ab" * 32, "{}", 10,
                                       [("sha256:" + "cd" * 32, 10)], aliases=["prod"],
                                       lineage=[LineageEdge("run", "run-42")],
                                       actor="ana", host="gpu-1")
            (v.ref, created)   # -> ('bert@1', True)
        """
        validate_name(name)
        validate_digest(digest)
        if not isinstance(size, int) or size < 0:
            raise UsageError(f"invalid version size {size!r}")
        blob_sizes = writes.blobs_input(blobs)
        index = packs if packs is not None else PackIndex.from_json(packs_json)
        alias_names = list(dict.fromkeys(validate_alias(a) for a in aliases))
        edges = writes.lineage_input(lineage)
        sigs = writes.signatures_input(signatures, digest)
        metadata_json = json_text(dict(metadata or {}), "version metadata")
        build_json = json_text(dict(build), "build info") if build is not None else None
        environment_json = (json_text(dict(environment), "environment")
                            if environment is not None else None)
        extra = _audit_details(audit_details)

        def work(s: Session) -> tuple[VersionRecord, bool]:
            _gc_lock(s)  # before any row lock: the order every writer takes them in
            if claim is not None and s.get(PendingPushRow, claim) is None:
                raise writes.lost_claim_error(name, digest)
            model = writes.lock_model_for_publish(s, name)
            row = s.scalars(select(VersionRow).where(VersionRow.model_id == model.id,
                                                     VersionRow.digest == digest)).one_or_none()
            created = row is None
            if row is None and missing_blobs is not None:
                missing = missing_blobs(sorted(blob_sizes))
                if missing:
                    raise writes.missing_blobs_error(name, digest, missing)
            if row is None:
                linked = writes.check_parents(s, edges, identity)
                row = writes.insert_version(
                    s, model, digest=digest, manifest_json=manifest_json, size=size,
                    blobs=blob_sizes, edges=linked, metadata_json=metadata_json,
                    build_json=build_json, environment_json=environment_json, actor=actor, packs=index)
                # the chain covers who published it, its metadata and its lineage too
                audit_log.append_event(s, "publish", actor=actor, host=host, model=name,
                                       number=row.number, digest=digest, ref=ref_for_audit,
                                       details={"size": size, "blobs": len(blob_sizes),
                                                "fields": writes.fields_hash(
                                                    actor, metadata_json, linked)},
                                       extra=extra)
            writes.check_claimed_versions(sigs, name, row.number)
            writes.add_signatures(s, row, name, sigs, actor=actor, host=host,
                                  audit=not created, extra=extra)
            for alias in alias_names:
                writes.point_alias(s, model, alias, row, actor=actor, host=host,
                                   ref=ref_for_audit, extra=extra, identity=identity)
            return self._record(s, name, row), created

        return self._write(work)

    # -- reads ------------------------------------------------------------------------------

    def resolve(self, ref: Ref | str) -> VersionRecord:
        """The version a ref names: latest non-yanked, number, alias or digest.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.resolve(Ref.parse("bert@2")).digest   # -> 'sha256:...'
            store.resolve("bert@7")   # raises NotFoundError: model 'bert' has no version 7 (latest is 3)
        """
        ref = Ref.parse(ref) if isinstance(ref, str) else ref

        def work(s: Session) -> VersionRecord:
            # The model id as a scalar subquery (not a join on models.name): PostgreSQL then
            # walks the (model_id, number) index backwards instead of sorting every version.
            model_id = select(ModelRow.id).where(ModelRow.name == ref.name).scalar_subquery()
            stmt = select(VersionRow).where(VersionRow.model_id == model_id)
            if ref.version is not None:
                stmt = stmt.where(VersionRow.number == ref.version)
            elif ref.digest is not None:
                stmt = stmt.where(VersionRow.digest == ref.digest)
            elif ref.alias is not None:
                stmt = stmt.join(AliasRow, AliasRow.version_id == VersionRow.id).where(
                    AliasRow.model_id == model_id, AliasRow.alias == ref.alias)
            else:
                stmt = (stmt.where(VersionRow.status != "yanked")
                        .order_by(VersionRow.number.desc()).limit(1))
            row = s.scalars(stmt).first()
            if row is None:
                raise self._not_found(s, ref)
            return self._record(s, ref.name, row, packs=True)

        return self._read(work)

    def get_manifest(self, name: str, number: int) -> str:
        """The manifest JSON text of ``name@number``.

        For example (``store`` an open ``SqlMetadataStore``)::

            json.loads(store.get_manifest("bert", 1))["format"]   # -> 1
        """
        return self._read(lambda s: self._version(s, self._model(s, name), number).manifest_json)

    def build_info(self, name: str, number: int) -> dict[str, Any] | None:
        """The informational build record published with a version (``build.json``), if any.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.build_info("bert", 1)["tool"]   # -> 'pt2-registry 0.1.0'
        """
        return self._read(lambda s: self._version(s, self._model(s, name), number)
                          .to_record(name, [], with_manifest=False).build)

    def version_blobs(self, name: str, number: int) -> list[tuple[str, int]]:
        """``(blob digest, size)`` pairs a version references, sorted by digest.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.version_blobs("bert", 1)   # -> [('sha256:cdcd...', 10)]
        """
        def work(s: Session) -> list[tuple[str, int]]:
            row = self._version(s, self._model(s, name), number)
            return [(d, n) for d, n in s.execute(
                select(VersionBlobRow.blob_digest, VersionBlobRow.size)
                .where(VersionBlobRow.version_id == row.id)
                .order_by(VersionBlobRow.blob_digest))]

        return self._read(work)

    def signatures(self, name: str, number: int) -> list[SignatureRecord]:
        """Signatures recorded for a version, oldest first.

        For example (``store`` an open ``SqlMetadataStore``)::

            [s.algorithm for s in store.signatures("bert", 1)]   # -> ['ed25519']
        """
        def work(s: Session) -> list[SignatureRecord]:
            # the version's id and digest alone (not its row: a manifest of 10,000 chunks is 0.9 MB)
            found = s.execute(select(VersionRow.id, VersionRow.digest)
                              .join(ModelRow, ModelRow.id == VersionRow.model_id)
                              .where(ModelRow.name == name, VersionRow.number == number)).one_or_none()
            if found is None:   # the NotFoundError saying what is missing
                row = self._version(s, self._model(s, name), number)
                found = row.id, row.digest
            version_id, digest = found
            return [sig.to_record(digest) for sig in s.scalars(
                select(SignatureRow).where(SignatureRow.version_id == version_id)
                .order_by(SignatureRow.id))]

        return self._read(work)

    def add_signature(self, name: str, number: int, signature: Mapping[str, Any], *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> SignatureRecord:
        """Record a signature of ``name@number`` (``pt2reg sign``): a well-formed entry over the
        version's digest (``format.signing.check_signature_entries``), audited as ``sign``; a
        statement signature replaces a legacy one by the same key. Returns the stored record."""
        from ..format.signing import check_signature_entries

        extra = _audit_details(audit_details)

        def work(s: Session) -> SignatureRecord:
            row = self._version(s, self._model(s, validate_name(name)), number)
            (entry,) = check_signature_entries(row.digest, [dict(signature)])
            writes.check_claimed_versions(writes.signatures_input([entry], row.digest), name, number)
            writes.add_signatures(s, row, name, writes.signatures_input([entry], row.digest), actor=actor,
                                  host=host, audit=True, extra=extra)
            stored = s.scalars(select(SignatureRow).where(SignatureRow.version_id == row.id,
                                                          SignatureRow.key_id == entry["key_id"])).one()
            return stored.to_record(row.digest)

        return self._write(work)

    def list_models(self) -> list[ModelRecord]:
        """Every model with its version count, highest number and aliases, by name.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(m.name, m.latest, m.aliases) for m in store.list_models()]   # -> [('bert', 3, {'prod': 2})]
        """
        def work(s: Session) -> list[ModelRecord]:
            aliases: dict[str, dict[str, int]] = {}
            for name, alias, number in s.execute(
                    select(ModelRow.name, AliasRow.alias, VersionRow.number)
                    .join(AliasRow, AliasRow.model_id == ModelRow.id)
                    .join(VersionRow, VersionRow.id == AliasRow.version_id)):
                aliases.setdefault(name, {})[alias] = number
            rows = s.execute(
                select(ModelRow.name, ModelRow.created_at, func.count(VersionRow.id),
                       func.max(VersionRow.number))
                .outerjoin(VersionRow, VersionRow.model_id == ModelRow.id)
                .group_by(ModelRow.id, ModelRow.name, ModelRow.created_at)
                .order_by(ModelRow.name))
            return [ModelRecord(name, count, latest, dict(sorted(aliases.get(name, {}).items())),
                                parse_ts(created)) for name, created, count, latest in rows]

        return self._read(work)

    def list_versions(self, name: str) -> list[VersionRecord]:
        """Every version of a model by number, without manifests (``manifest_json`` None).

        For example (``store`` an open ``SqlMetadataStore``)::

            [(v.number, v.status, v.aliases) for v in store.list_versions("bert")]
            # -> [(1, 'active', []), (2, 'active', ['prod'])]
        """
        def work(s: Session) -> list[VersionRecord]:
            model = self._model(s, name)
            aliases: dict[int, list[str]] = {}
            for vid, alias in s.execute(select(AliasRow.version_id, AliasRow.alias)
                                        .where(AliasRow.model_id == model.id)):
                aliases.setdefault(vid, []).append(alias)
            rows = s.scalars(select(VersionRow).options(defer(VersionRow.manifest_json))
                             .where(VersionRow.model_id == model.id)
                             .order_by(VersionRow.number))
            return [r.to_record(name, aliases.get(r.id, []), with_manifest=False) for r in rows]

        return self._read(work)

    def aliases(self, name: str) -> list[AliasRecord]:
        """Where each alias of a model points now, by alias name.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(a.alias, a.number) for a in store.aliases("bert")]   # -> [('prod', 2)]
        """
        def work(s: Session) -> list[AliasRecord]:
            model = self._model(s, name)
            rows = s.execute(select(AliasRow, VersionRow.number, VersionRow.digest)
                             .join(VersionRow, VersionRow.id == AliasRow.version_id)
                             .where(AliasRow.model_id == model.id).order_by(AliasRow.alias))
            return [AliasRecord(name, a.alias, number, digest, parse_ts(a.updated_at),
                                a.updated_by) for a, number, digest in rows]

        return self._read(work)

    # -- lifecycle --------------------------------------------------------------------------

    def set_alias(self, name: str, alias: str, number: int, *, actor: str, host: str,
                  ref_for_audit: str | None = None,
                  audit_details: Mapping[str, Any] | None = None,
                  identity: Identity | None = None) -> AliasRecord:
        """Point ``alias`` at ``name@number`` (audited as alias.set or alias.move), if the
        alias's policy allows it (PolicyError, exit 7; ``identity``: the server's token).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.set_alias("bert", "prod", 2, actor="ana", host="laptop").number   # -> 2
        """
        validate_alias(alias)
        extra = _audit_details(audit_details)

        def work(s: Session) -> AliasRecord:
            model = self._model(s, name, lock=True)
            version = self._version(s, model, number)
            row = writes.point_alias(s, model, alias, version, actor=actor, host=host,
                                     ref=ref_for_audit, extra=extra, identity=identity)
            return AliasRecord(name, alias, version.number, version.digest,
                               parse_ts(row.updated_at), row.updated_by)

        return self._write(work)

    def remove_alias(self, name: str, alias: str, *, actor: str, host: str,
                     ref_for_audit: str | None = None,
                     audit_details: Mapping[str, Any] | None = None,
                     identity: Identity | None = None) -> AliasRecord:
        """Delete an alias; returns where it pointed. NotFoundError if it does not exist,
        PolicyError (exit 7) if its policy forbids it (immutable, role scope).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.remove_alias("bert", "staging", actor="ana", host="laptop").number   # -> 3
        """
        extra = _audit_details(audit_details)

        def work(s: Session) -> AliasRecord:
            model = self._model(s, name, lock=True)
            row = s.scalars(select(AliasRow).where(AliasRow.model_id == model.id,
                                                   AliasRow.alias == alias)).one_or_none()
            if row is None:
                raise NotFoundError(f"model {name!r} has no alias {alias!r}", what="alias",
                                    name=name)
            version = s.get_one(VersionRow, row.version_id)
            record = AliasRecord(name, alias, version.number, version.digest,
                                 parse_ts(row.updated_at), row.updated_by)
            governance.enforce_remove(s, name, alias, version.number, identity)
            s.delete(row)
            audit_log.append_event(s, "alias.remove", actor=actor, host=host, model=name,
                                   number=version.number, digest=version.digest,
                                   ref=ref_for_audit, details={"alias": alias}, extra=extra)
            return record

        return self._write(work)

    def set_status(self, name: str, number: int, status: str, reason: str | None, *,
                   actor: str, host: str, ref_for_audit: str | None = None,
                   audit_details: Mapping[str, Any] | None = None) -> VersionRecord:
        """Deprecate, yank or restore (``active``) a version, with a reason; audited
        (``ref_for_audit``: the ref as the user gave it, e.g. ``bert@prod``).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.set_status("bert", 2, "yanked", "bad accuracy", actor="ana",
                             host="laptop").status   # -> 'yanked'
        """
        if status not in STATUSES:
            raise UsageError(f"unknown status {status!r}", hint=f"one of {', '.join(STATUSES)}")
        reason = (reason or "").strip() or None
        if status != "active" and reason is None:
            raise UsageError(f"a reason is required to mark a version {status}")
        extra = _audit_details(audit_details)

        def work(s: Session) -> VersionRecord:
            model = self._model(s, name, lock=True)
            row = self._version(s, model, number)
            if (row.status, row.status_reason) != (status, reason):
                row.status, row.status_reason = status, reason
                row.status_by, row.status_at = actor, now_text(s)
                audit_log.append_event(s, _STATUS_ACTIONS[status], actor=actor, host=host,
                                       model=name, number=number, digest=row.digest,
                                       ref=ref_for_audit, details={"reason": reason},
                                       extra=extra)
            return self._record(s, name, row)

        return self._write(work)

    def alias_at(self, name: str, alias: str, when: datetime) -> int | None:
        """The version number ``alias`` pointed to at ``when`` (None: it did not exist then).

        Answered from the audit log; naive datetimes are taken as UTC.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.alias_at("bert", "prod", datetime(2026, 11, 22, tzinfo=timezone.utc))   # -> 1
        """
        def work(s: Session) -> int | None:
            self._model(s, name)
            return audit_log.alias_at(s, name, alias, when)

        return self._read(work)

    # -- audit ------------------------------------------------------------------------------

    def record_event(self, action: str, *, actor: str, host: str, model: str | None = None,
                     number: int | None = None, digest: str | None = None,
                     ref: str | None = None, details: Mapping[str, Any] | None = None,
                     ) -> AuditEvent:
        """Append an event that has no state change of its own (pull, load, gc.delete).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.record_event("pull", actor="svc", host="inf-3", model="bert", number=2,
                               ref="bert@prod").seq   # -> 7
        """
        if not isinstance(action, str) or not action or len(action) > 32:
            raise UsageError(f"invalid audit action {action!r}")
        if details is not None:
            json_text(dict(details), "audit details")
        return self._write(lambda s: audit_log.append_event(
            s, action, actor=actor, host=host, model=model, number=number, digest=digest,
            ref=ref, details=details).to_record())

    def events(self, model: str | None = None, since: datetime | None = None
               ) -> list[AuditEvent]:
        """Audit events in chain order, optionally of one model and at or after ``since``.

        For example (``store`` an open ``SqlMetadataStore``)::

            [e.action for e in store.events(model="bert")]   # -> ['publish', 'alias.set', 'pull']
        """
        stmt = select(AuditEventRow).order_by(AuditEventRow.seq)
        if model is not None:
            stmt = stmt.where(AuditEventRow.model == model)
        if since is not None:
            stmt = stmt.where(AuditEventRow.ts >= format_ts(since))
        return self._read(lambda s: [row.to_record() for row in s.scalars(stmt)])

    def audit_hashes(self, seqs: Sequence[int] = ()) -> tuple[tuple[int, str] | None, dict[int, str]]:
        """The newest event as ``(seq, hash)`` (None for an empty log), and the hashes of the
        events ``seqs`` that exist, read in one transaction.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.audit_hashes([3])   # -> ((7, '9f2c...'), {3: '41ab...'})
        """
        def work(s: Session) -> tuple[tuple[int, str] | None, dict[int, str]]:
            head = s.execute(select(AuditEventRow.seq, AuditEventRow.hash)
                             .order_by(AuditEventRow.seq.desc()).limit(1)).first()
            found = dict(s.execute(select(AuditEventRow.seq, AuditEventRow.hash)
                                   .where(AuditEventRow.seq.in_(list(seqs)))).all()) if seqs else {}
            return (tuple(head) if head else None), found
        return self._read(work)

    def verify_version_contents(self) -> ChainVerdict | None:
        """None when every stored manifest hashes to its version's digest and each version's
        size, metadata and blob records are what its manifest says; else a failed verdict
        naming the version."""
        return self._read(audit_log.verify_contents)

    def verify_audit_chain(self) -> ChainVerdict:
        """Re-walk the whole chain, then check versions, statuses and aliases against a replay
        of it (catches a deleted newest event and state edited behind the log's back):
        ``(ok, first_bad_seq, reason)``; ``first_bad_seq`` is None when no event names the
        mismatch (e.g. a version row inserted without any event).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.verify_audit_chain()   # -> ChainVerdict(ok=True, first_bad_seq=None, reason='7 events, chain intact')
        """
        return self._read(audit_log.verify)

    # -- lineage ----------------------------------------------------------------------------

    def _start_id(self, s: Session, name: str, number: int) -> int:
        return self._version(s, self._model(s, name), number).id

    def ancestors(self, name: str, number: int) -> list[LineageNode]:
        """The version (depth 0) and every version it derives from, nearest first.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(n.ref, n.depth) for n in store.ancestors("distil", 1)]
            # -> [('distil@1', 0), ('bert@2', 1), ('bert@1', 2)]
        """
        return self._read(lambda s: graph.nodes(
            s, graph.walk(s, [self._start_id(s, name, number)], graph.parent_ids)))

    def descendants(self, name: str, number: int) -> list[LineageNode]:
        """The version (depth 0) and every version derived from it, nearest first.

        For example (``store`` an open ``SqlMetadataStore``)::

            [n.ref for n in store.descendants("bert", 1)]   # -> ['bert@1', 'bert@2', 'distil@1']
        """
        return self._read(lambda s: graph.nodes(
            s, graph.walk(s, [self._start_id(s, name, number)], graph.child_ids)))

    def versions_from_dataset(self, uri: str, *, digest: str | None = None
                              ) -> list[LineageNode]:
        """Versions trained on ``uri`` (depth 0) and all versions derived from them, with the
        aliases pointing at each now. Empty when nothing used the dataset.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(n.ref, n.aliases) for n in store.versions_from_dataset("s3://d/train")]
            # -> [('bert@1', []), ('bert@2', ['prod']), ('distil@1', [])]
        """
        if digest is not None:
            validate_digest(digest)
        return self._read(lambda s: graph.nodes(
            s, graph.walk(s, graph.dataset_ids(s, uri, digest), graph.child_ids)))

    # -- crash-safe gc ----------------------------------------------------------------------

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
        from ..format.manifest import stored_blobs  # a manifest parse: loaded by gc, not by every command

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

    # -- tokens -----------------------------------------------------------------------------

    def create_token(self, owner: str, scopes: Sequence[str], *, expires_at: datetime | None,
                     actor: str, host: str, audit_details: Mapping[str, Any] | None = None,
                     ) -> tuple[TokenRecord, str]:
        """Create an API token; returns ``(record, secret)``. The secret is returned this once:
        only its SHA-256 is stored. Scopes are parsed and stored canonically (UsageError for a
        bad one); audited as ``token.create`` (owner, scopes, expiry; never the secret).

        For example (``store`` an open ``SqlMetadataStore``)::

            record, secret = store.create_token("ci", ["model:team/*:push,pull"],
                                                expires_at=None, actor="ana", host="laptop")
            record.scopes, secret[:5]   # -> (['model:team/*:pull,push'], 'pt2r_')
        """
        validate_owner(owner)
        if isinstance(scopes, str):
            raise UsageError("token scopes must be a list of scopes, not one string")
        canonical = list(dict.fromkeys(parse_scope(text).text for text in scopes))
        if not canonical:
            raise UsageError("a token needs at least one scope",
                             hint="pass --scope, e.g. --scope model:team/*:pull")
        if expires_at is not None and expires_at.tzinfo is None:
            raise UsageError("a token's expiry must be a timezone-aware datetime")
        extra = _audit_details(audit_details)
        secret = new_secret()
        digest = hash_secret(secret)
        record = self._write(lambda s: token_rows.create(
            s, owner=owner, scopes=canonical, secret_hash=digest, expires_at=expires_at,
            actor=actor, host=host, extra=extra).to_record())
        return record, secret

    def list_tokens(self) -> list[TokenRecord]:
        """Every token (revoked and expired ones too), by id; never a secret.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(t.id, t.owner) for t in store.list_tokens()]   # -> [(1, 'ci')]
        """
        return self._read(lambda s: [row.to_record() for row in s.scalars(
            select(TokenRow).order_by(TokenRow.id))])

    def revoke_token(self, token_id: int, *, actor: str, host: str,
                     audit_details: Mapping[str, Any] | None = None) -> TokenRecord:
        """Revoke a token now (NotFoundError for an unknown id); audited as ``token.revoke``.
        Revoking a revoked token returns it unchanged.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.revoke_token(1, actor="ana", host="laptop").revoked_at is not None   # -> True
        """
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise UsageError(f"invalid token id {token_id!r}", hint="`pt2reg token list` shows them")
        extra = _audit_details(audit_details)
        return self._write(lambda s: token_rows.revoke(
            s, token_id, actor=actor, host=host, extra=extra).to_record())

    def authenticate(self, secret: str) -> Identity:
        """The identity of the token with ``secret``: NotAuthenticatedError (exit 7) when no
        token has it, or it was revoked or has expired (saying when, by the database's clock).
        A read; ``last_used_at`` is written at most once a minute per token.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.authenticate(secret).owner   # -> 'ci'
        """
        if not isinstance(secret, str) or not secret.strip():
            raise NotAuthenticatedError("no token given",
                                        hint="set PT2REG_TOKEN or pass --token-file")
        digest = hash_secret(secret.strip())
        identity, due = self._read(lambda s: token_rows.check(s, digest))
        if due:
            self._write(lambda s: token_rows.touch(s, identity.token_id))
        return identity

    def pullable_blob_models(self, digests: Sequence[str]) -> dict[str, set[str]]:
        """``digest -> names of the models whose versions reference it``, for each of
        ``digests`` some version references (unreferenced digests are absent); the server lets
        a token fetch a blob only when it may pull one of those models.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.pullable_blob_models(["sha256:cdcd..."])   # -> {'sha256:cdcd...': {'bert'}}
        """
        wanted = validate_digests(digests)
        return self._read(lambda s: token_rows.blob_models(s, wanted))

    def latest_versions(self) -> dict[str, VersionRecord]:
        """Each model's highest-numbered version (without its manifest), by model name: what
        the web page's model list shows (metadata searched, last change), in one query.

        For example (``store`` an open ``SqlMetadataStore``)::

            {n: v.number for n, v in store.latest_versions().items()}   # -> {'bert': 3}
        """
        def work(s: Session) -> dict[str, VersionRecord]:
            newest = (select(VersionRow.model_id, func.max(VersionRow.number).label("number"))
                      .group_by(VersionRow.model_id).subquery())
            rows = s.execute(select(ModelRow.name, VersionRow).options(defer(VersionRow.manifest_json))
                             .join(VersionRow, VersionRow.model_id == ModelRow.id)
                             .join(newest, (newest.c.model_id == VersionRow.model_id)
                                   & (newest.c.number == VersionRow.number)))
            return {name: row.to_record(name, [], with_manifest=False) for name, row in rows}

        return self._read(work)

    def signature_counts(self, name: str) -> dict[int, int]:
        """``version number -> number of signatures`` for the signed versions of a model."""
        def work(s: Session) -> dict[int, int]:
            model = self._model(s, name)
            return dict(s.execute(select(VersionRow.number, func.count(SignatureRow.id))
                                  .join(SignatureRow, SignatureRow.version_id == VersionRow.id)
                                  .where(VersionRow.model_id == model.id)
                                  .group_by(VersionRow.number)).all())

        return self._read(work)

    # -- governance: alias policies and attestations ----------------------------------------

    def set_policy(self, name: str, alias: str, *, role_scope: str | None = None,
                   signers: Sequence[str] = (), attestations: Sequence[str] = (),
                   immutable: bool = False, actor: str, host: str,
                   audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        """Create or replace the policy on ``name@alias`` (``registry.access.policy``):
        ``role_scope`` (an action or ``admin``), ``signers`` (Ed25519 public keys as PEM text:
        one of them must have signed a version the alias points at), ``attestations`` (labels
        a version must have passed), ``immutable``. Audited as ``policy.set``; an immutable
        policy whose alias is set cannot be changed (PolicyError, exit 7).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.set_policy("team/m", "prod", signers=[pem], attestations=["cpu-ci"],
                             actor="ana", host="laptop").describe()   # -> 'signed by sha256:...; attested cpu-ci'
        """
        validate_name(name)
        validate_alias(alias)
        if role_scope is not None and role_scope not in ROLE_SCOPES:
            raise UsageError(f"invalid role scope {role_scope!r}", hint=f"one of {', '.join(ROLE_SCOPES)}")
        keys = [(key_id_of(public_key_from_pem(pem.encode("ascii", "replace"), f"policy key #{i + 1}")),
                 pem.strip() + "\n") for i, pem in enumerate(signers)]
        keys = list(dict((k, pem) for k, pem in keys).items())
        labels = list(dict.fromkeys(validate_label(a) for a in attestations))
        extra = _audit_details(audit_details)
        return self._write(lambda s: governance.set_policy(
            s, name, alias, role_scope=role_scope, signers=keys, attestations=labels,
            immutable=immutable, actor=actor, host=host, extra=extra))

    def remove_policy(self, name: str, alias: str, *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        """Delete the policy on ``name@alias``; returns it (audited ``policy.remove``).
        NotFoundError if there is none; PolicyError for an immutable one whose alias is set."""
        validate_name(name)
        validate_alias(alias)
        extra = _audit_details(audit_details)
        return self._write(lambda s: governance.remove_policy(s, name, alias, actor=actor, host=host,
                                                              extra=extra))

    def policies(self, name: str) -> list[AliasPolicy]:
        """The alias policies of model ``name``, by alias (a model need not exist yet).

        For example (``store`` an open ``SqlMetadataStore``)::

            [p.alias for p in store.policies("team/m")]   # -> ['prod']
        """
        validate_name(name)
        return self._read(lambda s: governance.policies(s, name))

    def record_attestation(self, name: str, number: int, *, label: str, passed: bool, device: str,
                           target: Mapping[str, Any], results: Sequence[Any], error: str | None = None,
                           signature: Mapping[str, Any] | None = None, public_key: str | None = None,
                           actor: str, host: str,
                           audit_details: Mapping[str, Any] | None = None) -> AttestationRecord:
        """Record a conformance attestation of ``name@number`` (audited ``attestation.record``).

        A signed one carries ``signature`` (``sign_digest`` over
        ``attestation_digest(attestation_statement(...))`` of these very fields and the
        version's digest) and the signer's ``public_key`` (PEM); the signature is verified
        here, SignatureError (exit 5) when it does not hold.
        """
        validate_label(label)
        if not isinstance(device, str) or not device or len(device) > 64:
            raise UsageError(f"invalid device {device!r}")
        if (signature is None) != (public_key is None):
            raise UsageError("a signed attestation needs both its signature and its public key")
        target_json = json_text(dict(target), "attestation target")
        results_json = json_text(list(results), "attestation results")
        extra = _audit_details(audit_details)

        def work(s: Session) -> AttestationRecord:
            version = self._version(s, self._model(s, name), number)
            key_id = sig_text = None
            if signature is not None and public_key is not None:
                statement = attestation_statement(
                    digest=version.digest, label=label, passed=passed, device=device,
                    target=json.loads(target_json), results=json.loads(results_json), error=error)
                wanted = attestation_digest(statement)
                if signature.get("digest") not in (None, wanted):
                    raise SignatureError(f"the attestation's signature is for {str(signature.get('digest'))[:80]}, "
                                         f"not for this statement ({wanted})",
                                         hint="the attestation was changed after it was signed")
                key_id = governance.check_attestation_signature(wanted, signature, public_key)
                sig_text = str(signature.get("signature"))
            return governance.record_attestation(
                s, name, version, label=label, passed=passed, device=device,
                target_json=target_json, results_json=results_json, error=error, key_id=key_id,
                signature=sig_text, public_key=public_key if key_id else None, actor=actor,
                host=host, extra=extra)

        return self._write(work)

    def attestations(self, name: str, number: int) -> list[AttestationRecord]:
        """The attestations of ``name@number``, oldest first.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(a.label, a.passed) for a in store.attestations("team/m", 4)]   # -> [('cpu-ci', True)]
        """
        return self._read(lambda s: governance.attestations(
            s, name, self._version(s, self._model(s, name), number)))

    # -- OCI artifacts --------------------------------------------------------------------------
    def record_oci_artifact(self, name: str, number: int, *, location: str, tag: str | None, manifest_digest: str,
                            actor: str, host: str, audit_details: Mapping[str, Any] | None = None) -> OciArtifactRecord:
        """Record that ``name@number`` was pushed to the OCI repository ``location`` (``HOST/REPO``)
        as ``manifest_digest`` (under ``tag``), audited as ``oci.push``; a push recorded already
        is returned as it was."""
        validate_digest(manifest_digest)
        extra = _audit_details(audit_details)

        def work(s: Session) -> OciArtifactRecord:
            version = self._version(s, self._model(s, validate_name(name)), number)
            row = s.scalars(select(OciArtifactRow).where(
                OciArtifactRow.version_id == version.id, OciArtifactRow.location == location,
                OciArtifactRow.manifest_digest == manifest_digest,
                OciArtifactRow.tag.is_(None) if tag is None else OciArtifactRow.tag == tag)).first()
            if row is None:
                row = OciArtifactRow(version_id=version.id, location=location, tag=tag,
                                     manifest_digest=manifest_digest, pushed_at=now_text(s), pushed_by=actor)
                s.add(row)
                s.flush()
                audit_log.append_event(s, "oci.push", actor=actor, host=host, model=name, number=number,
                                       digest=version.digest, details={"location": location, "tag": tag,
                                                                       "manifest_digest": manifest_digest},
                                       extra=extra)
            return _oci_record(row)

        return self._write(work)

    def oci_artifacts(self, name: str, number: int) -> list[OciArtifactRecord]:
        """Where ``name@number`` was pushed as an OCI artifact, oldest first."""
        def work(s: Session) -> list[OciArtifactRecord]:
            version = self._version(s, self._model(s, name), number)
            return [_oci_record(r) for r in s.scalars(select(OciArtifactRow).where(
                OciArtifactRow.version_id == version.id).order_by(OciArtifactRow.id))]

        return self._read(work)

    def oci_repositories(self, host: str) -> list[str]:
        """The repositories of OCI registry ``host`` versions were pushed to, newest push first
        (where a push may mount blobs from)."""
        return list(dict.fromkeys(repo for repo, _model in self.oci_locations(host)))

    def oci_locations(self, host: str) -> list[tuple[str, str]]:
        """(repository, model name) of the pushes to OCI registry ``host``, newest first, at
        most 64 (the server answers ``oci_repositories`` with those of models a caller may pull)."""
        prefix = host.lower() + "/"

        def work(s: Session) -> list[tuple[str, str]]:
            newest = func.max(OciArtifactRow.id)
            rows = s.execute(select(OciArtifactRow.location, ModelRow.name, newest)
                             .join(VersionRow, VersionRow.id == OciArtifactRow.version_id)
                             .join(ModelRow, ModelRow.id == VersionRow.model_id)
                             .where(OciArtifactRow.location.startswith(prefix, autoescape=True))
                             .group_by(OciArtifactRow.location, ModelRow.name).order_by(newest.desc())
                             .limit(64)).all()
            return [(loc[len(prefix):], name) for loc, name, _ in rows]

        return self._read(work)

    def attestation_counts(self, name: str) -> dict[int, tuple[int, int]]:
        """``version number -> (attestations passed, attestations in all)`` for the attested
        versions of a model, in one query (the web page's versions table)."""
        from .orm import AttestationRow

        def work(s: Session) -> dict[int, tuple[int, int]]:
            model = self._model(s, name)
            rows = s.execute(select(VersionRow.number, AttestationRow.passed, func.count(AttestationRow.id))
                             .join(AttestationRow, AttestationRow.version_id == VersionRow.id)
                             .where(VersionRow.model_id == model.id)
                             .group_by(VersionRow.number, AttestationRow.passed))
            out: dict[int, tuple[int, int]] = {}
            for number, passed, count in rows:
                ok, total = out.get(number, (0, 0))
                out[number] = (ok + (count if passed else 0), total + count)
            return out

        return self._read(work)

    # -- webhooks and signed audit heads (registry.store.outbox) ------------------------------
    def add_webhook(self, url: str, events: Sequence[str], model_glob: str | None, *,
                    secret_enc: str, key_id: str, actor: str, host: str,
                    audit_details: Mapping[str, Any] | None = None) -> Any:
        """Subscribe ``url`` to ``events`` (audited ``webhook.add``; the secret is given
        already encrypted under the server key ``key_id``, never in the log)."""
        from . import outbox

        def work(s: Session) -> Any:
            record = outbox.add_webhook(s, url, events, model_glob, secret_enc, key_id, actor=actor)
            audit_log.append_event(s, "webhook.add", actor=actor, host=host, details={
                "webhook": record.id, "url": url, "events": record.events, "model_glob": model_glob},
                extra=audit_details)
            return record
        return self._write(work)

    def list_webhooks(self) -> list[Any]:
        from . import outbox

        return self._read(outbox.list_webhooks)

    def remove_webhook(self, webhook_id: int, *, actor: str, host: str,
                       audit_details: Mapping[str, Any] | None = None) -> Any:
        from . import outbox

        def work(s: Session) -> Any:
            record = outbox.remove_webhook(s, webhook_id)
            audit_log.append_event(s, "webhook.remove", actor=actor, host=host,
                                   details={"webhook": webhook_id, "url": record.url}, extra=audit_details)
            return record
        return self._write(work)

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[Any]:
        from . import outbox

        return self._read(lambda s: outbox.deliveries(s, failed=failed, limit=limit))

    def redeliver_webhook(self, delivery_id: int) -> Any:
        from . import outbox

        return self._write(lambda s: outbox.redeliver(s, delivery_id))

    def audit_heads(self, *, newest_only: bool = False) -> list[Any]:
        """The audit heads the server signed, oldest first (``newest_only``: just the newest)."""
        from . import outbox

        return self._read(lambda s: outbox.heads(s, newest_only=newest_only))

    def find_events(self, *, model: str | None = None, actor: str | None = None,
                    action: str | None = None, since: datetime | None = None,
                    until: datetime | None = None, limit: int = 500) -> tuple[list[AuditEvent], int]:
        """The newest ``limit`` audit events matching every given filter (``action``: that
        action or its sub-actions, ``alias`` matches ``alias.set``), newest first, and how many
        match in all: the web page's audit log, filtered in SQL.

        For example (``store`` an open ``SqlMetadataStore``)::

            events, total = store.find_events(model="bert", action="alias", limit=10)
        """
        stmt = select(AuditEventRow)
        if model is not None:
            stmt = stmt.where(AuditEventRow.model == model)
        if actor is not None:
            stmt = stmt.where(AuditEventRow.actor == actor)
        if action is not None:
            stmt = stmt.where((AuditEventRow.action == action)
                              | AuditEventRow.action.startswith(action + ".", autoescape=True))
        if since is not None:
            stmt = stmt.where(AuditEventRow.ts >= format_ts(since))
        if until is not None:
            stmt = stmt.where(AuditEventRow.ts <= format_ts(until))

        def work(s: Session) -> tuple[list[AuditEvent], int]:
            total = s.scalar(select(func.count()).select_from(stmt.subquery())) or 0
            rows = s.scalars(stmt.order_by(AuditEventRow.seq.desc()).limit(limit))
            return [row.to_record() for row in rows], total

        return self._read(work)

    def versions_page(self, name: str, *, offset: int = 0, limit: int = 100
                      ) -> tuple[list[VersionRecord], int]:
        """``limit`` versions of a model newest first from ``offset`` (without manifests), and
        how many it has: the web page's versions table, one page read, not all of them."""
        def work(s: Session) -> tuple[list[VersionRecord], int]:
            model = self._model(s, name)
            total = s.scalar(select(func.count(VersionRow.id)).where(VersionRow.model_id == model.id)) or 0
            rows = list(s.scalars(select(VersionRow).options(defer(VersionRow.manifest_json))
                                  .where(VersionRow.model_id == model.id)
                                  .order_by(VersionRow.number.desc()).offset(offset).limit(limit)))
            aliases: dict[int, list[str]] = {}
            for vid, alias in s.execute(select(AliasRow.version_id, AliasRow.alias)
                                        .where(AliasRow.version_id.in_([r.id for r in rows]))):
                aliases.setdefault(vid, []).append(alias)
            return [r.to_record(name, aliases.get(r.id, []), with_manifest=False) for r in rows], total

        return self._read(work)

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


def _oci_record(row: OciArtifactRow) -> OciArtifactRecord:
    return OciArtifactRecord(location=row.location, tag=row.tag, manifest_digest=row.manifest_digest,
                             pushed_at=parse_ts(row.pushed_at), pushed_by=row.pushed_by)
