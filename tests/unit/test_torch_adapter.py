"""``registry/runtime/torchrt/`` is the only package that touches torch's private APIs.

A torch upgrade that moves a private API should break that one file. The check reads every
source of ``registry/`` with ``ast`` (nothing is imported) and reports, outside the adapter:

* imports of a private torch module or name (``from torch.utils._pytree import ...``,
  ``import torch._C``, ``from torch.export import _trace``);
* attribute reads with a private name on torch itself (``torch._C._get_schema``, also through
  ``torch()`` or a name bound to torch: ``t = torch(); t._C``);
* private torch modules named to an importer (``importlib.import_module("torch._dynamo")``,
  ``sys.modules.get("torch.utils._pytree")``).

Names of private torch functions as *data* (the graph checker's allowlists in
``registry/pt2/safety.py``) are strings compared with a graph's contents, not API uses.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ADAPTER = Path("registry/runtime/torchrt")
_PRIVATE_MODULE = re.compile(r"^torch(\.[A-Za-z0-9_]+)*\._")
_IMPORTERS = {"import_module", "__import__", "find_spec", "get"}


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _root(node: ast.AST) -> ast.AST:
    while True:
        if isinstance(node, ast.Attribute):
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Subscript):
            node = node.value
        else:
            return node


def _private_parent(node: ast.Attribute) -> bool:
    """``torch._C`` inside ``torch._C._get_schema``: reported once, for the whole chain."""
    return isinstance(node.value, ast.Attribute) and _private(node.value.attr)


def _is_torch_call(node: ast.AST, lazy: set[str]) -> bool:
    """``torch()`` or ``<module>.torch()`` (the adapter's lazy import), under any name in ``lazy``."""
    if not isinstance(node, ast.Call):
        return False
    f = node.func
    return (isinstance(f, ast.Name) and f.id in lazy) or (isinstance(f, ast.Attribute) and f.attr == "torch")


def private_torch_uses(source: str) -> list[str]:
    """``line: what`` for every private torch API use in one module's source."""
    tree = ast.parse(source)
    torch_names, lazy = {"torch"}, {"torch"}
    for node in ast.walk(tree):  # names bound to the torch module, or to the adapter's torch()
        if isinstance(node, ast.Import):
            torch_names.update(a.asname for a in node.names if a.name == "torch" and a.asname)
        elif isinstance(node, ast.ImportFrom):
            lazy.update(a.asname for a in node.names if a.name == "torch" and a.asname)
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and _is_torch_call(node.value, lazy):
            torch_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    found = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"{line}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] == "torch" and any(map(_private, a.name.split(".")))]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "torch":
            parts = node.module.split(".")
            if any(map(_private, parts)) or any(_private(a.name) for a in node.names):
                found.append(f"{line}: from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Attribute) and _private(node.attr) and not _private_parent(node):
            root = _root(node)
            if isinstance(root, ast.Name) and (root.id in torch_names or root.id in lazy):
                found.append(f"{line}: {ast.unparse(node)}")
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
                and isinstance(node.args[0].value, str) and _PRIVATE_MODULE.match(node.args[0].value):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in _IMPORTERS:
                found.append(f"{line}: {ast.unparse(node)}")
    return sorted(set(found), key=lambda s: int(s.split(":")[0]))


def test_private_torch_apis_are_used_only_by_the_adapter():
    problems = []
    for path in sorted((ROOT / "registry").rglob("*.py")):
        rel = path.relative_to(ROOT)
        if ADAPTER in rel.parents:
            continue
        problems += [f"{rel}:{use}" for use in private_torch_uses(path.read_text("utf-8"))]
    assert problems == [], "private torch APIs outside registry/runtime/torchrt/:\n" + "\n".join(problems)


def test_the_adapter_is_where_they_are():
    uses = [use for path in sorted((ROOT / ADAPTER).rglob("*.py")) for use in private_torch_uses(path.read_text("utf-8"))]
    assert any(u.endswith("._C") for u in uses) and any("_pytree" in u for u in uses), uses
    assert not (ROOT / "registry/runtime/torchrt_dispatch.py").exists()
    assert not (ROOT / "registry/runtime/torchrt.py").exists()   # one adapter: the package, not a module beside it


def test_the_check_finds_each_kind_of_use():
    source = (
        "import torch\nimport torch._dynamo\nimport torch as T\n"
        "from torch.utils._pytree import tree_map\nfrom torch.export import _trace\n"
        "from .torchrt import torch as lazy\n"
        "def f():\n"
        "    a = torch._C._get_schema('aten::add', '')\n"
        "    t = lazy()\n"
        "    b = t._C._dispatch_get_all_op_names()\n"
        "    c = T.ops._schema\n"
        "    importlib.import_module('torch._inductor.lowering')\n"
        "    sys.modules.get('torch.utils._pytree')\n"
        "    ok = (torch.__version__, torch.export.load, ep.module(), 'torch._C._set_grad_enabled')\n"
    )
    uses = private_torch_uses(source)
    assert [u.split(":")[0] for u in uses] == ["2", "4", "5", "8", "10", "11", "12", "13"], uses
