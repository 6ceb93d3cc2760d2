"""Row writes shared by publish and the lifecycle commands, each inside a store transaction.

Validation of caller input happens before a transaction opens (``*_input`` functions), so a
retried transaction never re-validates and a bad argument never touches the database.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ..access.scopes import Identity
from ..errors import ConflictError, IntegrityError, NotFoundError, UsageError
from ..format.packs import PackIndex
from ..refs import Ref, validate_digest
from . import governance
from .audit_chain import version_fields_hash
from .audit_log import append_event
from .orm import (
    LINEAGE_KINDS,
    AliasRow,
    LineageRow,
    ModelRow,
    SignatureRow,
    VersionBlobRow,
    VersionPackRow,
    VersionRow,
    json_text,
    now_text,
)
from .records import LineageEdge, SignatureRecord

__all__ = ["lineage_input", "blobs_input", "signatures_input", "lock_model_for_publish",
           "check_parents", "parent_not_found", "missing_blobs_error", "lost_claim_error", "insert_version",
           "add_signatures", "point_alias", "fields_hash"]


def _edge(item: LineageEdge | Mapping | tuple) -> LineageEdge:
    edge = item if isinstance(item, LineageEdge) else (
        LineageEdge(**item) if isinstance(item, Mapping) else LineageEdge(*item))
    if edge.kind not in LINEAGE_KINDS:
        raise UsageError(f"unknown lineage kind {edge.kind!r}",
                         hint=f"one of {', '.join(LINEAGE_KINDS)}")
    if not isinstance(edge.value, str) or not edge.value:
        raise UsageError(f"lineage {edge.kind} edge has an empty value")
    if edge.digest is not None:
        validate_digest(edge.digest)
    elif edge.kind == "parent":
        raise UsageError(f"parent {edge.value!r} needs its version digest")
    return edge


def lineage_input(items: Iterable[LineageEdge | Mapping | tuple]) -> list[LineageEdge]:
    """Validated, de-duplicated edges; accepts records, mappings or tuples."""
    unique: dict[tuple, LineageEdge] = {}
    for edge in map(_edge, items):
        key = (edge.kind, edge.value, edge.digest, json_text(edge.extra, "lineage extra"))
        unique.setdefault(key, edge)
    return list(unique.values())


def blobs_input(blobs: Iterable[tuple[str, int]]) -> dict[str, int]:
    """``{digest: size}``; the same digest twice with two sizes is a usage error."""
    found: dict[str, int] = {}
    for digest, size in blobs:
        validate_digest(digest)
        if not isinstance(size, int) or size < 0:
            raise UsageError(f"blob {digest} has an invalid size {size!r}")
        if found.setdefault(digest, size) != size:
            raise UsageError(f"blob {digest} listed with two sizes ({found[digest]} and {size})")
    return found


def _signature(item: SignatureRecord | Mapping | tuple) -> SignatureRecord:
    if isinstance(item, SignatureRecord):
        return item
    if isinstance(item, Mapping):
        return SignatureRecord(item.get("key_id"), item.get("algorithm"), item.get("signature"),
                               digest=item.get("digest"))
    return SignatureRecord(*item)


def signatures_input(items: Iterable[SignatureRecord | Mapping | tuple], digest: str
                     ) -> list[SignatureRecord]:
    """Signature records from records, ``signatures.json`` entries (mappings) or
    ``(key_id, algorithm, signature_b64)`` tuples; each must sign ``digest`` if it names one."""
    sigs = [_signature(item) for item in items]
    for sig in sigs:
        if not all(isinstance(v, str) and v for v in (sig.key_id, sig.algorithm, sig.signature)):
            raise UsageError(f"incomplete signature {sig!r}")
        if sig.digest is not None and sig.digest != digest:
            raise UsageError(f"the signature by {sig.key_id} is for {sig.digest}, "
                             f"not for this version ({digest})")
    return sigs


def check_claimed_versions(sigs: Iterable[SignatureRecord], name: str, number: int) -> None:
    """ConflictError (exit 6, nothing recorded) when a statement signature names this model
    but another version than ``number`` (it was made for the version a publish expected, and
    another publish took that number meanwhile): the signer pushes again. Statements naming
    other models (a bundle re-published under a new name) are kept: they vouch for nothing here."""
    from ..format.oms import claimed

    for sig in sigs:
        if sig.algorithm != "oms-v1":
            continue
        model, version = claimed(sig.signature)
        if model == name and version is not None and version != number:
            raise ConflictError(f"the signature by {sig.key_id[:19]}... names {name}@{version}, but this is "
                                f"{name}@{number}: another version was published meanwhile",
                                hint="push again (the signature is made for the number the version gets)")


def lock_model_for_publish(session: Session, name: str) -> ModelRow:
    """The model row, created if missing, locked until commit (PostgreSQL row lock; SQLite's
    write transaction already excludes other writers)."""
    stmt = select(ModelRow).where(ModelRow.name == name).with_for_update()
    row = session.scalars(stmt).one_or_none()
    if row is None:
        # Two first publishers race to create the model: one inserts, the other waits for it
        # and then finds the row instead of failing on the unique name.
        dialect = session.get_bind().dialect.name
        if dialect == "postgresql":  # dialect modules load lazily: they cost CLI start-up
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        session.execute(insert(ModelRow).values(name=name, created_at=now_text(session))
                        .on_conflict_do_nothing(index_elements=["name"]))
        row = session.scalars(stmt).one()
    return row


def check_parents(session: Session, edges: list[LineageEdge], identity: Identity | None = None) -> list[LineageEdge]:
    """``edges`` with each parent linked to the version it is stored for: the version of the
    model its value names (a ref; its model part counts) whose digest is the edge's, its value
    written ``name@number``. The digest is what the graph links by, so it is what is checked:
    a parent that is not such a version of a model ``identity`` may pull (None: direct access,
    every model) is ``parent_not_found``, one answer whether the digest exists elsewhere or
    nowhere, so naming a guessed digest never tells that a hidden model holds it."""
    parents = [e for e in edges if e.kind == "parent"]
    if not parents:
        return edges
    found = {(digest, name): number for digest, name, number in session.execute(
        select(VersionRow.digest, ModelRow.name, VersionRow.number)
        .join(ModelRow, ModelRow.id == VersionRow.model_id)
        .where(VersionRow.digest.in_(sorted({e.digest for e in parents if e.digest}))))}
    linked = []
    for edge in edges:
        if edge.kind == "parent":
            edge = _linked_parent(edge, found, identity)
        linked.append(edge)
    return lineage_input(linked)


def _linked_parent(edge: LineageEdge, found: Mapping[tuple[str, str], int], identity: Identity | None) -> LineageEdge:
    try:
        ref = Ref.parse(edge.value)
    except UsageError:
        raise parent_not_found(edge) from None
    number = found.get((edge.digest or "", ref.name))
    if (number is None or (identity is not None and not identity.allows("pull", ref.name))
            or ref.version not in (None, number) or ref.digest not in (None, edge.digest)):
        raise parent_not_found(edge)
    return dataclasses.replace(edge, value=f"{ref.name}@{number}")


def parent_not_found(edge: LineageEdge) -> NotFoundError:
    """The one answer for a parent that is not a version the caller may pull: its text holds
    only what the caller sent."""
    return NotFoundError(f"parent {edge.value} ({edge.digest}) is not in this registry", what="digest")


def missing_blobs_error(name: str, digest: str, missing: list[str]) -> IntegrityError:
    """The one answer for a publish naming blobs the store lacks, or holds for someone else
    (``registry.server.ownership``): the caller cannot tell which."""
    return IntegrityError(f"cannot publish {name} ({digest}): {len(missing)} of its blobs are missing from "
                          f"the blob store, first {missing[0]}; nothing was recorded",
                          hint="push again (it uploads them)")


def lost_claim_error(name: str, digest: str) -> ConflictError:
    """The answer for a publish whose pending-push claim is gone (or, to a server's client, is
    not its own)."""
    return ConflictError(f"push of {name} ({digest}) lost its pending-push claim: gc reaped it "
                         f"because the push stalled past its heartbeat; nothing was recorded",
                         hint="push again (it uploads whatever gc deleted)")


def insert_version(session: Session, model: ModelRow, *, digest: str, manifest_json: str,
                   size: int, blobs: dict[str, int], edges: list[LineageEdge],
                   metadata_json: str, build_json: str | None, environment_json: str | None,
                   actor: str, packs: PackIndex = PackIndex()) -> VersionRow:
    """Insert the next version of a locked model with its blobs, lineage edges and pack index."""
    latest = session.scalar(select(func.max(VersionRow.number))
                            .where(VersionRow.model_id == model.id))
    row = VersionRow(model_id=model.id, number=(latest or 0) + 1, digest=digest,
                     manifest_json=manifest_json, size=size, status="active",
                     created_at=now_text(session), created_by=actor, build_json=build_json,
                     environment_json=environment_json, metadata_json=metadata_json)
    session.add(row)
    session.flush()
    session.add_all(VersionBlobRow(version_id=row.id, blob_digest=d, size=n)
                    for d, n in blobs.items())
    session.add_all(LineageRow(version_id=row.id, kind=e.kind, value=e.value, digest=e.digest,
                               extra_json=json_text(e.extra, "lineage extra")
                               if e.extra else None)
                    for e in edges)
    if packs:
        session.add(VersionPackRow(version_id=row.id, packs_json=packs.to_json()))
    return row


def fields_hash(actor: str, metadata_json: str, edges: list[LineageEdge]) -> str:
    """What a new version's publish event records as ``fields`` (see
    :func:`registry.store.audit_chain.version_fields_hash`), from the values exactly as stored."""
    return version_fields_hash(actor, metadata_json, [
        (e.kind, e.value, e.digest, json_text(e.extra, "lineage extra") if e.extra else None)
        for e in edges])


def add_signatures(session: Session, row: VersionRow, name: str, sigs: list[SignatureRecord],
                   *, actor: str, host: str, audit: bool,
                   extra: Mapping[str, Any] | None = None) -> None:
    """Add signatures by keys not yet recorded; ``audit`` a ``sign`` event for each (used when
    signing an existing version; a new version's publish event covers its signatures). A
    statement signature (``oms-v1``) replaces a legacy bare-digest one by the same key (one
    signature per key and version); any other signature by a key already recorded is left out."""
    have = {r.key_id: r for r in session.scalars(select(SignatureRow).where(SignatureRow.version_id == row.id))}
    for sig in sigs:
        old = have.get(sig.key_id)
        if old is not None and not (sig.algorithm == "oms-v1" and old.algorithm != "oms-v1"):
            continue
        replaced = old.algorithm if old is not None else None
        if old is not None:
            old.algorithm, old.signature, old.created_at = sig.algorithm, sig.signature, now_text(session)
        else:
            have[sig.key_id] = SignatureRow(version_id=row.id, key_id=sig.key_id, algorithm=sig.algorithm,
                                            signature=sig.signature, created_at=now_text(session))
            session.add(have[sig.key_id])
        if audit:
            append_event(session, "sign", actor=actor, host=host, model=name,
                         number=row.number, digest=row.digest,
                         details={"key_id": sig.key_id, "algorithm": sig.algorithm,
                                  **({"replaced": replaced} if replaced else {})},
                         extra=extra)


def point_alias(session: Session, model: ModelRow, alias: str, version: VersionRow, *,
                actor: str, host: str, ref: str | None,
                extra: Mapping[str, Any] | None = None, identity: Identity | None = None) -> AliasRow:
    """Create or move an alias (audited alias.set / alias.move); a no-op if already there.
    The alias's policy (``registry.store.governance``) is enforced first: PolicyError (exit 7)
    when it refuses; ``identity`` is the server's token (None: direct access, as admin)."""
    if version.status == "yanked":
        raise ConflictError(f"cannot point {alias!r} at {model.name}@{version.number}: it is "
                            f"yanked ({version.status_reason})")
    row = session.scalars(select(AliasRow).where(AliasRow.model_id == model.id,
                                                 AliasRow.alias == alias)).one_or_none()
    if row is not None and row.version_id == version.id:
        return row
    current = (session.scalar(select(VersionRow.number).where(VersionRow.id == row.version_id))
               if row is not None else None)
    governance.enforce_move(session, model.name, alias, version, current, identity)
    now = now_text(session)  # read before a half-filled row is pending (autoflush)
    details: dict[str, Any] = {"alias": alias}
    if row is None:
        row = AliasRow(model_id=model.id, alias=alias, version_id=version.id)
        session.add(row)
        action = "alias.set"
    else:
        details["from"] = current
        row.version_id = version.id
        action = "alias.move"
    row.updated_at, row.updated_by = now, actor
    append_event(session, action, actor=actor, host=host, model=model.name,
                 number=version.number, digest=version.digest, ref=ref, details=details,
                 extra=extra)
    return row
