"""Lineage graph walks over the metadata tables, one breadth-first level per few queries.

Parent edges point at a parent's *digest*, so a walk up resolves digests to versions and a walk
down finds versions with a parent edge to the current digests. Used by
:class:`registry.store.sql.SqlMetadataStore`; every function takes an open session.
"""
from __future__ import annotations

import json
from typing import Callable, Iterable

from sqlalchemy import select
from sqlalchemy.orm import Session

from .audit_chain import parse_ts
from .orm import AliasRow, LineageRow, ModelRow, VersionRow
from .records import LineageNode

__all__ = ["walk", "parent_ids", "child_ids", "dataset_ids", "nodes"]

Step = Callable[[Session, list[int]], Iterable[int]]


def walk(session: Session, start: Iterable[int], step: Step) -> dict[int, int]:
    """Breadth-first from ``start`` (depth 0) along ``step``; version id -> first depth met."""
    depth = {vid: 0 for vid in start}
    frontier = list(depth)
    level = 0
    while frontier:
        level += 1
        found = [vid for vid in dict.fromkeys(step(session, frontier)) if vid not in depth]
        for vid in found:
            depth[vid] = level
        frontier = found
    return depth


def parent_ids(session: Session, ids: list[int]) -> list[int]:
    """Versions that the given versions name as parents.

    A digest published under several names resolves to the version the edge names
    (``value`` is the parent's ref as resolved at publish), else to the first published.
    """
    edges = session.execute(
        select(LineageRow.value, LineageRow.digest)
        .where(LineageRow.version_id.in_(ids), LineageRow.kind == "parent")).all()
    digests = {digest for _, digest in edges if digest}
    if not digests:
        return []
    candidates: dict[str, list[tuple[int, str]]] = {}
    for vid, digest, name, number in session.execute(
            select(VersionRow.id, VersionRow.digest, ModelRow.name, VersionRow.number)
            .join(ModelRow, ModelRow.id == VersionRow.model_id)
            .where(VersionRow.digest.in_(digests)).order_by(VersionRow.id)):
        candidates.setdefault(digest, []).append((vid, f"{name}@{number}"))
    found = []
    for value, digest in edges:
        options = candidates.get(digest or "", [])
        named = [vid for vid, ref in options if ref == value]
        if named or options:
            found.append(named[0] if named else options[0][0])
    return found


def child_ids(session: Session, ids: list[int]) -> list[int]:
    """Versions that name any of the given versions as a parent."""
    digests = select(VersionRow.digest).where(VersionRow.id.in_(ids))
    return list(session.scalars(
        select(LineageRow.version_id).distinct()
        .where(LineageRow.kind == "parent", LineageRow.digest.in_(digests))))


def dataset_ids(session: Session, uri: str, digest: str | None = None) -> list[int]:
    """Versions with a dataset edge to ``uri`` (and that dataset digest, when given)."""
    stmt = select(LineageRow.version_id).distinct().where(
        LineageRow.kind == "dataset", LineageRow.value == uri)
    if digest is not None:
        stmt = stmt.where(LineageRow.digest == digest)
    return list(session.scalars(stmt))


def nodes(session: Session, depth: dict[int, int]) -> list[LineageNode]:
    """Records for the walked versions with their edges and current aliases, by depth."""
    if not depth:
        return []
    ids = list(depth)
    edges: dict[int, list] = {}
    for row in session.scalars(select(LineageRow).where(LineageRow.version_id.in_(ids))
                               .order_by(LineageRow.id)):
        edges.setdefault(row.version_id, []).append(row.to_record())
    aliases: dict[int, list[str]] = {}
    for vid, alias in session.execute(select(AliasRow.version_id, AliasRow.alias)
                                      .where(AliasRow.version_id.in_(ids))):
        aliases.setdefault(vid, []).append(alias)
    rows = session.execute(
        select(VersionRow.id, ModelRow.name, VersionRow.number, VersionRow.digest,
               VersionRow.status, VersionRow.created_by, VersionRow.created_at,
               VersionRow.environment_json)
        .join(ModelRow, ModelRow.id == VersionRow.model_id).where(VersionRow.id.in_(ids))).all()
    found = [LineageNode(name=name, number=number, digest=digest, status=status,
                         depth=depth[vid], edges=edges.get(vid, []),
                         aliases=sorted(aliases.get(vid, [])), created_by=by,
                         created_at=parse_ts(at) if at else None,
                         environment=json.loads(env) if env else None)
             for vid, name, number, digest, status, by, at, env in rows]
    return sorted(found, key=lambda n: (n.depth, n.name, n.number))
