"""Import graph checks for ``registry/``: no cycles, and packages depend one way.

    python scripts/check_imports.py          # exit 1 and one line per problem

Reads the sources with ``ast`` (nothing is imported). Two graphs are checked:

* **module level** (imports that run when a module is imported, ``TYPE_CHECKING`` blocks
  left out): no cycle between modules at all;
* **every import**, including the lazy ones inside functions: no cycle between modules, and
  the package layers below depend one way only.
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "registry"

# Lower layers never import higher ones (a module may import its own layer).
LAYERS = [
    {"registry.errors", "registry.constants", "registry.config", "registry.refs", "registry.digests",
     "registry.atomic", "registry.parallel"},
    {"registry.format", "registry.blobs", "registry.access"},
    {"registry.pt2", "registry.store", "registry.client.sources", "registry.remote", "registry.oci"},
    {"registry.client"},
    {"registry.runtime"},
    {"registry.bundler"},
    {"registry.serving"},
    {"registry.server"},
    {"registry.cli", "registry"},
]


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or \
        (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def imports_of(path: Path, modules: set[str]) -> tuple[set[str], set[str]]:
    """(module-level imports, every import) of one file, as registry module names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text("utf-8"))
    top: set[str] = set()
    every: set[str] = set()

    def targets(node: ast.AST) -> set[str]:
        found: set[str] = set()
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "registry":
                    found.add(_resolve(a.name, modules))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != "registry":
                return found
            for a in node.names:
                sub = f"{mod}.{a.name}"
                found.add(sub if sub in modules else _resolve(mod, modules))
        return found

    def walk(node: ast.AST, at_top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for sub in child.orelse:
                    walk(sub, at_top)
                continue
            found = targets(child)
            every.update(found)
            if at_top:
                top.update(found)
            nested = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            walk(child, at_top and not nested)

    walk(tree, True)
    top.discard(name)
    every.discard(name)
    return top, every


def _resolve(mod: str, modules: set[str]) -> str:
    while mod not in modules and "." in mod:
        mod = mod.rsplit(".", 1)[0]
    return mod


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def layer_of(mod: str) -> int:
    best, depth = -1, -1
    for i, group in enumerate(LAYERS):
        for g in group:
            if (mod == g or mod.startswith(g + ".")) and len(g) > depth:
                best, depth = i, len(g)
    return best


def problems() -> list[str]:
    files = sorted(PKG.rglob("*.py"))
    modules = {module_name(p) for p in files}
    top: dict[str, set[str]] = {}
    every: dict[str, set[str]] = {}
    for p in files:
        top[module_name(p)], every[module_name(p)] = imports_of(p, modules)
    found = []
    for comp in cycles(top):
        found.append("import cycle at module level: " + " <-> ".join(comp))
    for comp in cycles(every):
        found.append("import cycle (counting imports inside functions): " + " <-> ".join(comp))
    for mod, deps in sorted(every.items()):
        if mod == "registry":
            continue
        for dep in sorted(deps):
            if dep == "registry":
                found.append(f"{mod} imports the package face 'registry'")
            elif layer_of(dep) > layer_of(mod):
                found.append(f"layering: {mod} (layer {layer_of(mod)}) imports {dep} (layer {layer_of(dep)})")
    return found


def main() -> int:
    found = problems()
    for line in found:
        print(line)
    if not found:
        print(f"registry/: no import cycles; {len(LAYERS)} layers depend one way")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
