"""Programs decoded into torch's schema dataclasses by ``SchemaDecoder`` (every type planned
once; ``registry/runtime/schema_decoding.py``), which the torch adapter routes torch's
``_dict_to_dataclass`` through inside the registry's own loads: the same objects as torch's
function for every program the suite exports, the same errors for malformed values, recursive
types, several threads at once; only inside the registry's loads, and only for the torch source
it ports. (No ``from __future__ import annotations``: the test's own schema types below carry
real annotations, as torch's schema module does.)"""
import json
import threading
import typing
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Optional

import pytest
import torch
import torch.export.pt2_archive._package as package
from torch._export.serde import schema, serialize
from torch._export.serde.union import _Union, _UnionTag

from registry.runtime import torchrt
from registry.runtime.schema_decoding import SchemaDecoder
from registry.runtime.torchrt import decoding


def torch_decode(cls: Any, data: Any) -> Any:
    """torch's own ``_dict_to_dataclass``, whether or not the adapter has routed it."""
    fn = serialize._dict_to_dataclass
    return getattr(fn, "torch_original", fn)(cls, data)


def json_members(pt2: Path) -> list[tuple[str, Any, Any]]:
    """(member, schema class, parsed JSON) of every program and payload config in ``pt2``."""
    out = []
    with zipfile.ZipFile(pt2) as z:
        for name in z.namelist():
            if "/models/" in name and name.endswith(".json"):
                out.append((name, schema.ExportedProgram, json.loads(z.read(name))))
            elif name.endswith(("_weights_config.json", "_constants_config.json")):
                out.append((name, schema.PayloadConfig, json.loads(z.read(name))))
    return out


def deep(value: Any) -> Any:
    """Everything an object holds, recursively: its type, and every attribute of every object
    in order (a tagged union's ``__eq__`` compares only its tag and value)."""
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [deep(v) for v in value])
    if isinstance(value, dict):
        return ("dict", [(k, deep(v)) for k, v in value.items()])
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return (type(value).__qualname__, [(k, deep(v)) for k, v in vars(value).items()])
    if isinstance(value, _UnionTag):
        return ("tag", str(value), value._cls.__qualname__)
    return (type(value).__name__, value)


def decoders() -> dict[str, SchemaDecoder]:
    """The decoder as the registry's loads use it (unions built by the adapter), and with each
    union built by its ``create``."""
    return {"adapter": SchemaDecoder(vars(schema), _Union, decoding._union_constructor(_Union, _UnionTag)),
            "create": SchemaDecoder(vars(schema), _Union)}


@pytest.mark.parametrize("kind", ["adapter", "create"])
def test_every_program_decodes_to_what_torch_gives(pt2_dir: Path, kind: str):
    decoder = decoders()[kind]
    seen = 0
    for pt2 in sorted(pt2_dir.rglob("*.pt2")):
        for member, cls, data in json_members(pt2):
            ours, theirs = decoder.decode(cls, data), torch_decode(cls, data)
            assert ours == theirs and repr(ours) == repr(theirs), f"{pt2.name}: {member}"
            assert deep(ours) == deep(theirs), f"{pt2.name}: {member}"
            seen += 1
    assert seen >= 10, seen


def test_unions_the_adapter_cannot_build_as_create_does_go_through_create(monkeypatch: pytest.MonkeyPatch):
    """A union class with its own ``__post_init__`` (or a torch whose ``create`` differs) is built
    by ``create``; a tag that is not a field raises as ``create`` does."""
    calls: list[str] = []

    @dataclass(repr=False, eq=False)
    class Checked(Tagged):
        as_int: int | None = None

        def __post_init__(self) -> None:
            calls.append("post_init")

    build = decoding._union_constructor(_Union, _UnionTag)
    assert deep(build(Checked)("as_int", 3)) == deep(Checked.create(as_int=3)) and calls == ["post_init"] * 2
    fast = build(Value)
    assert deep(fast("as_int", 4)) == deep(Value.create(as_int=4))
    with pytest.raises(TypeError) as theirs:
        Value.create(nope=1)
    with pytest.raises(TypeError) as ours:
        fast("nope", 1)
    assert str(ours.value) == str(theirs.value)
    monkeypatch.setattr(decoding, "UNION_PORTS", frozenset())
    created: list[Any] = []
    monkeypatch.setattr(Value, "create", classmethod(lambda cls, **kw: created.append(kw) or _Union.create.__func__(cls, **kw)))
    assert deep(decoding._union_constructor(_Union, _UnionTag)(Value)("as_int", 5)) == deep(_Union.create.__func__(Value, as_int=5))
    assert created == [{"as_int": 5}]


# -- the rules, on types of our own ------------------------------------------------------


class Tagged(_Union):
    pass


@dataclass(repr=False, eq=False)
class Value(Tagged):
    as_int: int | None = None
    as_floats: list[float] | None = None
    as_node: Optional["Node"] = None

    def __repr__(self) -> str:
        return f"Value({self.type}={self.value!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Value) and (self.type, self.value) == (other.type, other.value)


@dataclass
class Node:
    name: str
    weight: float
    children: list["Node"] = field(default_factory=list)
    attrs: dict[str, "Value"] = field(default_factory=dict)
    note: Annotated[str | None, "doc"] = None


NAMESPACE = {"Node": Node, "Value": Value}


def both(cls: Any, data: Any) -> tuple[Any, Any]:
    """What each decoder gives or raises for ``(cls, data)``, in our namespace."""
    def run(fn: Any) -> Any:
        try:
            return fn(cls, data)
        except Exception as exc:
            return (type(exc), str(exc))

    with pytest.MonkeyPatch.context() as mp:   # torch's function resolves names in its schema module
        for name, value in NAMESPACE.items():
            mp.setattr(schema, name, value, raising=False)
        results = [run(d.decode) for d in decoders().values()]
        assert all(repr(r) == repr(results[0]) and deep(r) == deep(results[0]) for r in results)
        return results[0], run(torch_decode)


TREE = {"name": "root", "weight": 1, "note": "top", "unknown": [1, 2],
        "children": [{"name": "leaf", "weight": 0.5, "children": [],
                      "attrs": {"a": {"as_int": 3}, "b": {"as_floats": [1, 2.5]},
                                "c": {"as_node": {"name": "deep", "weight": 2}}}}]}


@pytest.mark.parametrize("cls, data", [
    ("Node", TREE),                              # recursive, by name, with a key it ignores
    (Node, {"name": "n", "weight": 3}),          # an int where a float is declared: a float
    (typing.ForwardRef("Node"), TREE),
    (Optional[Node], None),
    (Annotated[Node, "x"], {"name": "n", "weight": 0}),
    (list[int], []),
    (dict[str, list[Node]], {"k": [{"name": "a", "weight": 1}]}),
    ("Value", {"as_int": 1}),
    ("Value", {"as_int": 1, "as_floats": [1.0]}),   # a union of two keys
    ("Value", [1]),                                  # not a dict
    ("Value", {"nope": 1}),                          # a tag the union lacks
    ("Nowhere", {}),                                 # a name the schema lacks
    (Node, {"name": "n"}),                           # a required field missing
    (Node, "a string"),
    (int, [1, 2]),                                   # a list where the type has no argument
    (typing.Union[int, str, None], 1),               # Optional of more than one type
    (typing.Union[int, str, None], None),
])
def test_the_same_value_or_the_same_error(cls: Any, data: Any):
    ours, theirs = both(cls, data)
    if isinstance(theirs, tuple) and theirs[:2] == (AssertionError, "") and isinstance(ours, tuple):
        ours = ours[:1] + ("",)  # torch 2.10's bare ``assert``s say nothing; 2.11 on say what (ported)
    assert ours == theirs
    assert repr(ours) == repr(theirs) and deep(ours) == deep(theirs)


def test_an_empty_list_is_handed_back_as_it_is():
    empty: list[int] = []
    assert SchemaDecoder(NAMESPACE, _Union).decode(list[int], empty) is empty


def test_threads_planning_at_once_get_the_same_objects(pt2_dir: Path):
    members = [m for pt2 in sorted(pt2_dir.rglob("*.pt2")) for m in json_members(pt2)]
    want = [torch_decode(cls, data) for _n, cls, data in members]
    decoder = SchemaDecoder(vars(schema), _Union)   # nothing planned yet: the threads race to plan
    got: dict[int, list[Any]] = {}
    start = threading.Barrier(4)

    def work(i: int) -> None:
        start.wait()
        got[i] = [decoder.decode(cls, data) for _n, cls, data in members]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(got[i] == want for i in range(4))


# -- where the adapter uses it ------------------------------------------------------------


def test_this_torch_is_the_one_ported():
    """If this fails after a torch upgrade, read torch's new ``_dict_to_dataclass`` and
    ``_resolve_schema_cls``, bring ``SchemaDecoder`` in line, and add the new digest to
    ``decoding.DECODER_PORTS`` (until then loads are only slower: torch's function decodes)."""
    assert decoding._install_schema_decoder()
    assert serialize._dict_to_dataclass is package._dict_to_dataclass
    assert hasattr(serialize._dict_to_dataclass, "torch_original")


def test_this_torchs_tagged_unions_are_built_directly():
    """The union fast path is on for this torch (every supported torch runs this test: the
    second-torch tier too). If it fails after a torch upgrade, read torch's new
    ``_Union.create``/``__post_init__``/``_UnionTag.create``, bring ``_union_constructor`` in
    line and add the digest to ``decoding.UNION_PORTS``."""
    assert decoding._source_digest(_Union.create, _Union.__post_init__, _UnionTag.create) in decoding.UNION_PORTS


def test_the_ported_digest_ignores_annotations_docstrings_and_comments_only():
    base = "def f(a, b=3):\n    y = a + b\n    return str(y)\n"
    dressed = ('def f(a: int, b: "int" = 3) -> str:\n    """Doc."""\n    # why\n    y: int = a + b  # sum\n'
               '    z: str\n    return str(y)\n')
    changed = "def f(a, b=3):\n    y = a - b\n    return str(y)\n"
    assert decoding._behaviour(base) == decoding._behaviour(dressed) != decoding._behaviour(changed)
    indented = "    def g(self, x: int) -> int:\n        return x\n"
    assert decoding._behaviour(indented) == "def g(self, x):\n    return x"


def test_only_the_registrys_loads_use_it(pt2_dir: Path, monkeypatch: pytest.MonkeyPatch):
    assert decoding._install_schema_decoder()
    calls: list[Any] = []
    planned = SchemaDecoder.decode

    def counted(self: SchemaDecoder, cls: Any, data: Any) -> Any:
        calls.append(cls)
        return planned(self, cls, data)

    monkeypatch.setattr(SchemaDecoder, "decode", counted)
    pt2 = next(p for p in sorted(pt2_dir.rglob("*.pt2")) if json_members(p))
    torch.export.load(pt2)                       # the user's own load: torch's function
    assert calls == []
    ours = torchrt.load_exported_program(pt2, map_weights=True)
    assert calls                                 # the registry's: planned
    theirs = torch.export.load(pt2)
    assert str(ours.graph) == str(theirs.graph)
    assert ours.range_constraints.keys() == theirs.range_constraints.keys()


def test_another_torch_keeps_its_own(monkeypatch: pytest.MonkeyPatch):
    """A torch whose decoder source is not the one ported is left as it is."""
    decoding._install_schema_decoder()
    original = serialize._dict_to_dataclass.torch_original
    monkeypatch.setattr(serialize, "_dict_to_dataclass", original)
    monkeypatch.setattr(package, "_dict_to_dataclass", original)
    monkeypatch.setattr(decoding, "_decoder_installed", None)
    monkeypatch.setattr(decoding, "DECODER_PORTS", frozenset({"0" * 64}))
    assert decoding._install_schema_decoder() is False
    assert serialize._dict_to_dataclass is original and package._dict_to_dataclass is original
