"""``VersionStore`` over SQL: models, versions, aliases, signatures and lineage."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, defer

from ...access.scopes import Identity
from ...errors import NotFoundError, UsageError
from ...format.packs import PackIndex
from ...refs import (
    Ref,
    validate_alias,
    validate_digest,
    validate_name,
)
from .. import audit_log, governance, writes
from .. import lineage as graph
from ..audit_chain import parse_ts
from ..orm import (
    STATUSES,
    AliasRow,
    ModelRow,
    PendingPushRow,
    SignatureRow,
    VersionBlobRow,
    VersionRow,
    json_text,
    now_text,
)
from ..records import (
    AliasRecord,
    LineageNode,
    ModelRecord,
    PublishRequest,
    SignatureRecord,
    VersionRecord,
)
from ._base import SqlStoreBase, _audit_details, _gc_lock

__all__ = ["SqlVersionStore"]

_STATUS_ACTIONS = {"deprecated": "deprecate", "yanked": "yank", "active": "restore"}


class SqlVersionStore(SqlStoreBase):
    """Versions and models: publish, resolve, list, aliases, status, signatures, lineage."""

    def publish(self, request: PublishRequest, *, actor: str, host: str,
                missing_blobs: Callable[[list[str]], list[str]] | None = None,
                audit_details: Mapping[str, Any] | None = None,
                identity: Identity | None = None) -> tuple[VersionRecord, bool]:
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

            v, created = store.publish(PublishRequest("bert", "sha256:" + "ab" * 32, "{}", 10,
                                                      [("sha256:" + "cd" * 32, 10)], aliases=["prod"],
                                                      lineage=[LineageEdge("run", "run-42")]),
                                       actor="ana", host="gpu-1")
            (v.ref, created)   # -> ('bert@1', True)
        """
        name, digest, size, claim = request.name, request.digest, request.size, request.claim
        manifest_json, ref_for_audit, packs = request.manifest_json, request.ref_for_audit, request.packs
        validate_name(name)
        validate_digest(digest)
        if not isinstance(size, int) or size < 0:
            raise UsageError(f"invalid version size {size!r}")
        blob_sizes = writes.blobs_input(request.blobs)
        index = packs if packs is not None else PackIndex.from_json(request.packs_json)
        alias_names = list(dict.fromkeys(validate_alias(a) for a in request.aliases))
        edges = writes.lineage_input(request.lineage)
        sigs = writes.signatures_input(request.signatures, digest)
        metadata_json = json_text(dict(request.metadata or {}), "version metadata")
        build_json = json_text(dict(request.build), "build info") if request.build is not None else None
        environment_json = (json_text(dict(request.environment), "environment")
                            if request.environment is not None else None)
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
        from ...format.signing import check_signature_entries

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
