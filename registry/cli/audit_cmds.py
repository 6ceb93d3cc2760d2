"""``pt2reg lineage`` and ``pt2reg audit``."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from ..format.times import iso_utc
from ._core import App, emit_json, pass_app
from .render import clean, console, esc
from .views import event_json, node_json

if TYPE_CHECKING:
    from ..store.records import LineageNode, VersionRecord

__all__ = ["lineage", "audit", "lineage_dot"]

_KIND_LABEL = {"dataset": "dataset", "run": "run", "commit": "commit", "code": "code"}


def _quote(text: str) -> str:
    """A DOT string literal; a newline in ``text`` becomes DOT's centred line break."""
    text = "\n".join(clean(line) for line in text.split("\n"))  # no raw control characters
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return '"' + escaped + '"'


def lineage_dot(nodes: list[LineageNode]) -> str:
    """A Graphviz digraph: versions (boxes), datasets (cylinders), runs and commits; arrows point
    from an input to what was derived from it."""
    by_digest = {n.digest: n for n in nodes}
    lines = ["digraph lineage {", "  rankdir=LR;", '  node [fontname="Helvetica"];']
    seen: set[str] = set()
    for n in nodes:
        label = n.ref + (f"\n[{', '.join(sorted(n.aliases))}]" if n.aliases else "")
        style = ', style=dashed' if n.status == "yanked" else ""
        lines.append(f"  {_quote(n.digest)} [shape=box, label={_quote(label)}{style}];")
        for e in n.edges:
            if e.kind == "parent":
                if e.digest and e.digest not in by_digest and e.digest not in seen:
                    seen.add(e.digest)
                    lines.append(f"  {_quote(e.digest)} [shape=box, label={_quote(e.value)}];")
                lines.append(f"  {_quote(e.digest or e.value)} -> {_quote(n.digest)} [label=\"parent\"];")
                continue
            # Two snapshots of one dataset URI are two inputs: the digest is part of the node.
            key = f"{e.kind}:{e.value}" + (f"@{e.digest}" if e.digest else "")
            if key not in seen:
                seen.add(key)
                shape = {"dataset": "cylinder", "run": "ellipse", "commit": "note", "code": "folder"}[e.kind]
                label = (f"{e.kind}: {e.value}" + (f"\n{e.digest[:19]}..." if e.digest else "")
                         + ("\n(dirty tree)" if (e.extra or {}).get("dirty") else ""))
                lines.append(f"  {_quote(key)} [shape={shape}, label={_quote(label)}];")
            lines.append(f"  {_quote(key)} -> {_quote(n.digest)};")
    lines.append("}")
    return "\n".join(lines)


def _print_tree(root: VersionRecord, nodes: list[LineageNode], descendants: bool) -> None:
    from rich.tree import Tree

    by_digest = {n.digest: n for n in nodes}
    children: dict[str, list[LineageNode]] = {}
    for n in nodes:
        for parent in n.parents:
            children.setdefault(parent, []).append(n)

    def label(n: LineageNode) -> str:
        extra = f" [{', '.join(sorted(n.aliases))}]" if n.aliases else ""
        status = f" ({esc(n.status)})" if n.status != "active" else ""
        return f"[bold]{esc(n.ref)}[/bold]{esc(extra)}{status} {esc(n.digest[:19])}..."

    def add(tree: Any, n: LineageNode, depth: int, path: set[str]) -> None:
        for e in n.edges:
            if e.kind != "parent":
                tree.add(esc(f"{_KIND_LABEL[e.kind]}: {e.value}" + (f" {e.digest}" if e.digest else "")
                             + (" (dirty)" if (e.extra or {}).get("dirty") else "")))
        nxt = children.get(n.digest, []) if descendants else [by_digest[p] for p in n.parents if p in by_digest]
        for m in nxt:
            if m.digest in path:
                continue
            add(tree.add(label(m)), m, depth + 1, path | {m.digest})

    start = by_digest.get(root.digest)
    tree = Tree(label(start) if start else esc(root.ref))
    if start:
        add(tree, start, 0, {start.digest})
    console().print(tree)


@click.command()
@click.argument("ref", required=False)
@click.option("--descendants", is_flag=True, help="Show what was derived from REF instead of its ancestry.")
@click.option("--dataset", "dataset", metavar="URI[@sha256:HEX]",
              help="List every version derived from this dataset, directly or transitively.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--dot", "as_dot", is_flag=True, help="Print a Graphviz digraph.")
@pass_app
def lineage(app: App, ref: str | None, descendants: bool, dataset: str | None, as_json: bool,
            as_dot: bool) -> None:
    """Where a version came from (parents, datasets, runs, commits), or what came from it."""
    if as_json and as_dot:
        raise click.UsageError("choose one of --json and --dot")
    if (ref is None) == (dataset is None):
        raise click.UsageError("give a REF or --dataset URI (not both)")
    reg = app.registry
    if dataset is not None:
        nodes = reg.dataset_lineage(dataset)
        if as_json:
            emit_json({"dataset": dataset, "versions": [node_json(n) for n in nodes]})
        elif as_dot:
            click.echo(lineage_dot(nodes))
        else:
            from rich.table import Table

            table = Table("version", "digest", "how", "aliases now", "status", box=None, header_style="bold")
            for n in nodes:
                how = "direct" if n.depth == 0 else f"derived ({n.depth} step{'s' if n.depth > 1 else ''})"
                table.add_row(esc(n.ref), esc(n.digest[:19]) + "...", how, esc(", ".join(sorted(n.aliases)) or "-"),
                              esc(n.status))
            console().print(table)
        return
    root, nodes = reg.lineage(ref, descendants=descendants)
    if as_json:
        emit_json({"ref": root.ref, "name": root.name, "version": root.number, "digest": root.digest,
                   "direction": "descendants" if descendants else "ancestors",
                   "nodes": [node_json(n) for n in nodes]})
    elif as_dot:
        click.echo(lineage_dot(nodes))
    else:
        _print_tree(root, nodes, descendants)


@click.command()
@click.option("--model", "model", metavar="NAME", help="Only events about this model.")
@click.option("--since", metavar="T", help="Only events at or after this ISO 8601 time.")
@click.option("--verify", "verify", is_flag=True,
              help="Re-walk the hash chain, replay it against the registry's state and check the "
                   "event this machine anchored at its last verify (HOME/audit-anchors.json) is "
                   "unchanged; exit 5 naming the first broken event, 0 when intact.")
@click.option("--server-key", "server_key", metavar="PUB", type=click.Path(dir_okay=False),
              help="With --verify: also check the chain against the audit heads the server "
                   "signed, with the server's public key (PEM, from GET /v1/keys): catches a "
                   "chain recomputed by someone with database access but not the key.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def audit(app: App, model: str | None, since: str | None, verify: bool, server_key: str | None,
          as_json: bool) -> None:
    """The append-only, hash-chained record of every change and every pull."""
    reg = app.registry
    if server_key and not verify:
        raise click.UsageError("--server-key goes with --verify")
    if verify:
        verdict = reg.verify_audit_signed(server_key) if server_key else reg.verify_audit()
        if as_json:
            emit_json({"intact": verdict.ok, "first_bad_event": verdict.first_bad_seq,
                       "reason": verdict.reason})
        if not verdict.ok:
            from ..errors import IntegrityError

            where = (f"at event {verdict.first_bad_seq}" if verdict.first_bad_seq is not None
                     else "(no event names the change)")
            raise IntegrityError(f"audit log broken {where}: {verdict.reason}",
                                 hint="the audit table or the registry tables were altered "
                                      "outside pt2reg")
        if not as_json:
            click.echo(f"audit chain intact ({verdict.reason})" if verdict.reason else "audit chain intact")
        return
    events = reg.audit_events(model=model, since=since)
    if as_json:
        emit_json({"events": [event_json(e) for e in events]})
        return
    from rich.table import Column, Table

    table = Table("seq", Column("time", no_wrap=True), "actor", "action", "ref", "digest", "details", box=None, header_style="bold")
    for e in events:
        ref = e.ref or (f"{e.model}@{e.version}" if e.model and e.version else e.model or "")
        table.add_row(str(e.seq), iso_utc(e.ts, seconds=True), esc(e.actor), esc(e.action), esc(ref),
                      esc((e.digest or "")[:19]),
                      # "fields" (a hash the chain keeps for --verify) is in --json, not here
                      esc(", ".join(f"{k}={v}" for k, v in (e.details or {}).items() if k != "fields")))
    console().print(table)


COMMANDS = [lineage, audit]
