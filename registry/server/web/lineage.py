"""The version page's lineage graph, laid out for an inline SVG. Pure: lineage nodes in (as
the server hands them to a token: models it cannot pull already ``restricted``), boxes and
arrows out. Generations run left to right: ancestors, the version, its descendants; the
version's datasets, run, commit and code sit in the column before it."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlencode

from ...store.records import LineageNode

__all__ = ["GraphBox", "GraphArrow", "LineageGraph", "layout"]

BOX_W, BOX_H, GAP_X, GAP_Y, PAD = 190, 44, 60, 16, 12
_FACTS = ("dataset", "run", "commit", "code")


@dataclass(frozen=True)
class GraphBox:
    key: str
    x: int
    y: int
    title: str                       # "team/base@1", "restricted", "dataset"
    subtitle: str                    # aliases / status, or the dataset URI
    kind: str                        # self | version | restricted | dataset | run | commit | code
    href: str | None                 # the node's page (None: restricted or a fact)

    @property
    def cx(self) -> int:
        return self.x + BOX_W // 2


@dataclass(frozen=True)
class GraphArrow:
    x1: int
    y1: int
    x2: int
    y2: int


@dataclass(frozen=True)
class LineageGraph:
    boxes: tuple[GraphBox, ...]
    arrows: tuple[GraphArrow, ...]
    width: int
    height: int
    box_w: int = BOX_W
    box_h: int = BOX_H


def version_href(name: str, number: int) -> str:
    return "/version?" + urlencode({"name": name, "number": number})


def _short(text: str, limit: int = 28) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _key(node: LineageNode) -> str:
    # one bundle may be published under several names (same digest): a node is its ref
    return f"restricted:{node.digest}:{node.depth}" if node.status == "restricted" else node.ref


def _links(walk: Sequence[LineageNode], upward: bool) -> list[tuple[str, str]]:
    """(parent key, child key) for each parent edge within one walk: a node at depth k links
    to the nodes one generation away whose digest its parent edges name."""
    by_depth: dict[int, list[LineageNode]] = {}
    for n in walk:
        by_depth.setdefault(n.depth, []).append(n)
    out = []
    for n in walk:
        if upward:  # ancestors: n's parents are at depth + 1
            out += [(_key(p), _key(n)) for p in by_depth.get(n.depth + 1, []) if p.digest in n.parents]
        else:       # descendants: n's parents are at depth - 1
            out += [(_key(p), _key(n)) for p in by_depth.get(n.depth - 1, []) if p.digest in n.parents]
    return out


def layout(ancestors: Sequence[LineageNode], descendants: Sequence[LineageNode]) -> LineageGraph:
    """Boxes per generation (column = -depth for ancestors, +depth for descendants), one
    arrow per parent edge between shown boxes, and one per fact of the version."""
    me = next((n for n in ancestors if n.depth == 0), None) or next(n for n in descendants if n.depth == 0)
    columns: dict[int, list[tuple[str, str, str, str, str | None]]] = {}
    seen: set[tuple[int, str]] = set()
    for node, sign in [(me, 0), *((n, -1) for n in ancestors if n.depth), *((n, 1) for n in descendants if n.depth)]:
        key = _key(node) if node.depth else _key(me)
        if (sign, key) in seen:
            continue
        seen.add((sign, key))
        if node.status == "restricted":
            entry = (key, "restricted", "no pull permission", "restricted", None)
        else:
            sub = ", ".join(node.aliases) if node.aliases else node.status
            entry = (key, _short(node.ref), _short(sub), "self" if node is me else "version",
                     version_href(node.name, node.number))
        columns.setdefault(sign * node.depth, []).append(entry)
    facts = [(f"{e.kind}:{e.value}", e.kind, _short(e.value), e.kind, None)
             for e in me.edges if e.kind in _FACTS]
    if facts:
        columns.setdefault(-1, []).extend(facts)
    first = min(columns)
    boxes = []
    where: dict[tuple[int, str], GraphBox] = {}
    for col in sorted(columns):
        for row, (key, title, sub, kind, href) in enumerate(columns[col]):
            box = GraphBox(key, PAD + (col - first) * (BOX_W + GAP_X), PAD + row * (BOX_H + GAP_Y),
                           title, sub, kind, href)
            boxes.append(box)
            where[(col, key)] = box

    def find(key: str, sign: int) -> GraphBox | None:
        return next((b for (c, k), b in where.items() if k == key and (c == 0 or (c > 0) == (sign > 0))), None)

    arrows = []
    for walk, sign in ((ancestors, -1), (descendants, 1)):
        for parent_key, child_key in _links(walk, upward=sign < 0):
            p, c = find(parent_key, sign), find(child_key, sign)
            if p is not None and c is not None and p is not c:
                arrows.append(GraphArrow(p.x + BOX_W, p.y + BOX_H // 2, c.x, c.y + BOX_H // 2))
    mine = where[(0, _key(me))]
    for key, *_ in facts:
        f = where[(-1, key)]
        arrows.append(GraphArrow(f.x + BOX_W, f.y + BOX_H // 2, mine.x, mine.y + BOX_H // 2))
    unique = tuple(dict.fromkeys(arrows))
    ncols = max(columns) - first + 1
    width = PAD * 2 + ncols * BOX_W + (ncols - 1) * GAP_X
    height = PAD * 2 + max(len(c) for c in columns.values()) * (BOX_H + GAP_Y) - GAP_Y
    return LineageGraph(tuple(boxes), unique, width, height)
