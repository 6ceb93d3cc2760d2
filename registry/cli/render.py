"""Human views (rich tables) of manifests, versions and reports. Pure formatting."""
from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..format.times import iso_utc

if TYPE_CHECKING:  # the manifest module costs every command its import; only `inspect` needs it
    from ..format.manifest import Manifest, Size

__all__ = ["format_dim", "format_shape", "format_size", "print_bundle", "console", "esc", "clean",
           "print_attestations"]


def console(stderr: bool = False) -> Any:
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160  # pipes and logs: don't wrap at 80 columns
    return Console(stderr=stderr, highlight=False, width=width)


#: characters that must never reach a terminal raw from a manifest or the database: C0/C1
#: controls (ESC starts ANSI sequences, CR overwrites a line, LF forges one), DEL, and the
#: bidirectional overrides that reorder what is shown
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def clean(text: Any) -> str:
    """``text`` with every control character shown as an escape (``\\x1b``, ``\\r``,
    ``\\n``), so a hostile string can neither drive the terminal nor forge a line."""
    return _UNPRINTABLE.sub(lambda m: ascii(m.group())[1:-1], str(text))


def esc(text: Any) -> str:
    """Text from a manifest, a target file or the database, made safe for rich: control
    characters shown as escapes and rich markup (``[bold red]``, an unbalanced ``[/x]``)
    printed literally. Every such string goes through this before it reaches a console."""
    from rich.markup import escape

    return escape(clean(text))


def format_size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def format_dim(d: Size) -> str:
    if isinstance(d, int):
        return str(d)
    return f"{d.label}:{d.min}..{'∞' if d.max is None else d.max}"


def format_shape(shape: Sequence[Size] | None) -> str:
    if shape is None:
        return "-"
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"


def print_bundle(manifest: Manifest, label: str | None) -> None:
    """Programs, signatures with ranges, ops, devices, samples and warnings at a glance."""
    from rich.table import Table

    from ..runtime.inputs import baked_arguments

    out = console()
    out.print(f"[bold]{esc(label)}[/bold]  {esc(manifest.digest)}")
    out.print(f"format {esc(manifest.format)}, {len(manifest.programs)} program(s), "
              f"{len(manifest.members)} member(s), {format_size(manifest.total_size)}")
    for name, prog in manifest.programs.items():
        variants = esc(", ".join(v.id for v in prog.variants))
        ser = prog.serialization
        out.print(f"\n[bold]program {esc(name)}[/bold]  variants: {variants}  "
                  f"(torch {esc(ser.torch_version)}, serde {esc(ser.schema_version[0])}."
                  f"{esc(ser.schema_version[1])})")
        if ser.window is not None:  # which torch reads it: from what it uses (registry.pt2.window)
            uses = f": {'; '.join(ser.window.features)}" if ser.window.features else ""
            out.print(f"  reads on torch >= {esc(ser.window.torch)} (serde {ser.window.schema[0]}."
                      f"{ser.window.schema[1]}{esc(uses)})")
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("", "name", "where", "dtype", "shape"):
            table.add_column(col)
        for i in prog.inputs:
            table.add_row("in", esc(i.name), esc(i.path or ""), esc(i.dtype), esc(format_shape(i.shape)))
        # baked in at export: a call passes the same value or none
        for a in baked_arguments(prog):
            table.add_row("const", esc(a.name), esc(a.path), esc("none" if a.value is None else type(a.value).__name__),
                          esc(f"= {a.value!r}"))
        for o in prog.outputs:
            table.add_row("out", esc(o.name), esc(o.path or ""), esc(o.dtype), esc(format_shape(o.shape)))
        out.print(table)
        derived = [c for c in prog.range_constraints if "+" in c.expr or "*" in c.expr]
        if derived:
            out.print("  derived dims: " + esc(", ".join(format_dim(c) for c in derived)))
        if prog.required_ops:
            out.print("  required ops: " + clean(", ".join(
                f"{op.name}.{op.overload}" + (f" [{op.schema}]" if op.schema else " (schema unknown)")
                for op in prog.required_ops)), markup=False)
        if prog.pytree_classes:  # library output classes (transformers ModelOutput ...)
            out.print("  pytree classes: " + clean(", ".join(
                f"{c.type} ({', '.join(c.fields)})" if c.fields is not None
                else f"{c.type} (fields unknown: needs --import {c.type.rsplit('.', 1)[0]})"
                for c in prog.pytree_classes)), markup=False)
        if prog.torchbind_classes:
            out.print("  torchbind classes: " + esc(", ".join(prog.torchbind_classes)))
        for v in prog.variants:
            if v.kind == "aoti":
                from ..format.manifest import AotiTarget

                t = v.target or AotiTarget()
                out.print(esc(f"  AOTInductor {v.id}: device {t.device_key}, "
                              f"sm {t.compute_capability or '-'}, {t.platform or '-'} "
                              f"{t.machine or ''} {t.cpu_isa or ''}".rstrip()))
    if manifest.samples:
        out.print("\n[bold]samples[/bold]: " + esc(", ".join(
            f"{s.name} ({s.program}, rtol {s.rtol:g}, atol {s.atol:g})" for s in manifest.samples)))
    req = manifest.requirements
    out.print("\n[bold]requirements[/bold]: " + esc(
        f"torch {req.torch or 'any'}; devices "
        f"{', '.join(req.device_types or ['any'])}; hardware dtypes "
        f"{', '.join(req.hardware_dtypes) or 'none'}"))
    if manifest.metadata:
        out.print("[bold]metadata[/bold]: " + esc(", ".join(f"{k}={v}" for k, v in sorted(manifest.metadata.items()))))
    env = manifest.environment
    out.print("[bold]built with[/bold]: " + esc(
        f"python {env.python}, torch {env.torch}, {env.platform}" + (f", CUDA {env.cuda}" if env.cuda else "")))
    for w in manifest.warnings():
        out.print(f"[yellow]warning[/yellow]: {esc(w)}")


def print_attestations(attestations: Sequence[Any], *, title: str = "attestations") -> None:
    """A version's attestations: label, verdict, device and target, worst sample error, signer."""
    from rich.table import Table

    table = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for col in ("id", "label", "result", "device", "target", "max abs", "signed by", "by", "at"):
        table.add_column(col, no_wrap=col == "at")  # a time is one unbroken token
    for a in attestations:
        t = a.target or {}
        cc = t.get("compute_capability")
        where = " ".join(str(p) for p in (f"torch {t.get('torch')}", f"sm_{cc[0]}{cc[1]}" if cc else None,
                                          f"CUDA {t.get('cuda')}" if t.get("cuda") else None,
                                          f"driver {t.get('driver')}" if t.get("driver") else None) if p)
        errors = [o.get("max_abs") for r in a.results if isinstance(r, dict)
                  for o in r.get("outputs", []) if isinstance(o, dict) and o.get("max_abs") is not None]
        verdict = "[green]passed[/green]" if a.passed else f"[red]FAILED[/red] {esc(a.error or '')}".rstrip()
        table.add_row(str(a.id), esc(a.label), verdict, esc(a.device), esc(where),
                      f"{max(errors):.3g}" if errors else "-",
                      esc(a.key_id[:19] + "...") if a.key_id else "unsigned", esc(a.created_by),
                      esc(iso_utc(a.created_at, seconds=True) or "-"))
    console().print(table)
