"""Human views (rich tables) of manifests, versions and reports. Pure formatting."""
from __future__ import annotations

from typing import Any, Mapping

__all__ = ["format_dim", "format_shape", "format_size", "print_bundle", "console", "esc"]


def console(stderr: bool = False) -> Any:
    import sys

    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    width = None if stream.isatty() else 160  # pipes and logs: don't wrap at 80 columns
    return Console(stderr=stderr, highlight=False, width=width)


def esc(text: Any) -> str:
    from rich.markup import escape

    return escape(str(text))


def format_size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def format_dim(d: Any) -> str:
    if isinstance(d, int):
        return str(d)
    label = d.get("dim") or d.get("expr")
    hi = "∞" if d.get("max") is None else str(d["max"])
    return f"{label}:{d['min']}..{hi}"


def format_shape(shape: Any) -> str:
    if shape is None:
        return "-"
    return "[" + ", ".join(format_dim(d) for d in shape) + "]"


def print_bundle(view: Mapping[str, Any]) -> None:
    """Programs, signatures with ranges, ops, devices, samples and warnings at a glance."""
    from rich.table import Table

    out = console()
    title = f"[bold]{esc(view.get('ref') or view.get('path'))}[/bold]  {view['digest']}"
    out.print(title)
    out.print(f"format {view['format']}, {len(view['programs'])} program(s), "
              f"{len(view['members'])} member(s), {format_size(view['size'])}")
    for name, prog in view["programs"].items():
        variants = ", ".join(v["id"] for v in prog["variants"])
        ser = prog["serialization"]
        out.print(f"\n[bold]program {name}[/bold]  variants: {variants}  "
                  f"(torch {ser['torch_version']}, serde {ser['schema_version'][0]}.{ser['schema_version'][1]})")
        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        for col in ("", "name", "where", "dtype", "shape"):
            table.add_column(col)
        for i in prog["inputs"]:
            table.add_row("in", esc(i["name"]), esc(i.get("path", "")), i["dtype"], esc(format_shape(i["shape"])))
        for o in prog["outputs"]:
            table.add_row("out", esc(o["name"]), esc(o.get("path", "")), o["dtype"], esc(format_shape(o["shape"])))
        out.print(table)
        derived = [c for c in prog["range_constraints"] if "+" in c["expr"] or "*" in c["expr"]]
        if derived:
            out.print("  derived dims: " + ", ".join(
                f"{c.get('dim') or c['expr']}:{c['min']}..{'∞' if c['max'] is None else c['max']}" for c in derived))
        if prog["required_ops"]:
            out.print("  required ops: " + ", ".join(
                f"{op['name']}.{op['overload']}" + (f" [{op['schema']}]" if op.get("schema") else " (schema unknown)")
                for op in prog["required_ops"]), markup=False)
        if prog["torchbind_classes"]:
            out.print("  torchbind classes: " + ", ".join(prog["torchbind_classes"]))
        for v in prog["variants"]:
            if v["kind"] == "aoti":
                t = v.get("target") or {}
                out.print(f"  AOTInductor {v['id']}: device {t.get('device_key')}, "
                          f"sm {t.get('compute_capability') or '-'}, {t.get('platform') or '-'} "
                          f"{t.get('machine') or ''} {t.get('cpu_isa') or ''}".rstrip())
    if view["samples"]:
        out.print("\n[bold]samples[/bold]: " + ", ".join(
            f"{s['name']} ({s['program']}, rtol {s['rtol']:g}, atol {s['atol']:g})" for s in view["samples"]))
    req = view["requirements"]
    out.print(f"\n[bold]requirements[/bold]: torch {req.get('torch') or 'any'}; devices "
              f"{', '.join(req.get('device_types') or ['any'])}; hardware dtypes "
              f"{', '.join(req.get('hardware_dtypes') or []) or 'none'}")
    if view["metadata"]:
        out.print("[bold]metadata[/bold]: " + esc(", ".join(f"{k}={v}" for k, v in sorted(view["metadata"].items()))))
    env = view["environment"]
    out.print(f"[bold]built with[/bold]: python {env.get('python')}, torch {env.get('torch')}, "
              f"{env.get('platform')}" + (f", CUDA {env['cuda']}" if env.get("cuda") else ""))
    for w in view.get("warnings", []):
        out.print(f"[yellow]warning[/yellow]: {esc(w)}")
