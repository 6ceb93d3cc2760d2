"""Lineage graph walks over the metadata tables, one breadth-first level per few queries.

Parent edges point at a parent's *digest*, so a walk up resolves digests to versions and a walk
down finds versions with a parent edge to the current digests. Used by
:class:`registry.store.sql.SqlMetadataStore`; every function takes an open session.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable

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
    """Versions that the given versions name as parents."""
    edges = session.execute(
        select(LineageRow.value, LineageRow.digest)
        .where(LineageRow.version_id.in_(ids), LineageRow.kind == "parent")).all()
    return [vid for vid in _linked(session, edges) if vid is not None]


def child_ids(session: Session, ids: list[int]) -> list[int]:
    """Versions that name any of the given versions as a parent (an edge to a digest the given
    versions share with another version links to the one it names, as ``parent_ids`` says)."""
    digests = select(VersionRow.digest).where(VersionRow.id.in_(ids))
    edges = session.execute(
        select(LineageRow.version_id, LineageRow.value, LineageRow.digest)
        .where(LineageRow.kind == "parent", LineageRow.digest.in_(digests))).all()
    wanted = set(ids)
    linked = _linked(session, [(value, digest) for _, value, digest in edges])
    return list(dict.fromkeys(child for (child, _, _), parent in zip(edges, linked) if parent in wanted))


def _linked(session: Session, edges: Iterable[tuple[str, str | None]]) -> list[int | None]:
    """The version each parent edge ``(value, digest)`` links to: a digest published under several
    names resolves to the version the edge names (``value``, the parent's ``name@number`` as
    checked at publish), else to the first published; None when no version has it."""
    edges = list(edges)
    candidates: dict[str, list[tuple[int, str]]] = {}
    digests = {digest for _, digest in edges if digest}
    if digests:
        for vid, digest, name, number in session.execute(
                select(VersionRow.id, VersionRow.digest, ModelRow.name, VersionRow.number)
                .join(ModelRow, ModelRow.id == VersionRow.model_id)
                .where(VersionRow.digest.in_(digests)).order_by(VersionRow.id)):
            candidates.setdefault(digest, []).append((vid, f"{name}@{number}"))
    found: list[int | None] = []
    for value, digest in edges:
        options = candidates.get(digest or "", [])
        named = [vid for vid, ref in options if ref == value]
        found.append(named[0] if named else (options[0][0] if options else None))
    return found


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
