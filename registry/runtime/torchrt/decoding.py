"""The serializer's JSON decoding, routed to ``registry.runtime.schema_decoding`` inside the
registry's loads when torch's decoder source is one this code ports (``DECODER_PORTS``,
``UNION_PORTS``); torch's own function decodes otherwise."""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass


__all__ = ['DECODER_PORTS', 'UNION_PORTS']


#: ``_source_digest`` (the source without comments, docstrings and annotations) of torch's
#: ``_dict_to_dataclass`` and ``_resolve_schema_cls``, the behaviour
#: ``schema_decoding.SchemaDecoder`` ports: torch 2.13.0 and 2.14.1 (2.14 only added
#: annotations); 2.11.0 (it tests ``get_origin(cls) == typing.Union`` where 2.13 also accepts
#: ``types.UnionType``: the same for its schema, whose optionals are all ``Optional[...]``);
#: 2.10.0 (that, and bare ``assert``s where 2.11 on raise ``AssertionError`` with a message:
#: the same checks). With other code (another torch) programs are decoded by torch's own
#: function, and ``tests/unit/test_schema_decoding.py`` fails on a supported torch until it is ported
DECODER_PORTS = frozenset({"ff5b136bceed364bf594598d25246aa77cbf88f67e5af2b2899781c319b5c905",   # 2.13, 2.14
                           "15e38ce0fbb0059d9d2a769647ff286f4932228f1680342a39efed2a2af9b0ad",   # 2.11
                           "b62840f48593ceb7807e4ab9246289530db8a5227e0d28c665d88badc55fdd2d"})  # 2.10
#: the same of ``_Union.create``, ``_Union.__post_init__`` and ``_UnionTag.create`` (torch 2.11.0
#: to 2.14.1; 2.10.0's bare ``assert``s make the same checks), what ``_union_constructor`` builds
#: directly; with other code each tagged union is built by its ``create``
UNION_PORTS = frozenset({"e3e6179fb13b738c6ef4871c77d43b995fb3ac25368d584342c836eef65ad391",    # 2.11 to 2.14
                         "debd4bd8d4ca206491eed821899b5b1943873f57d207d3ba7ee20a13d26c9d23"})   # 2.10
_DECODING = threading.local()   # ``active`` while this thread runs one of the registry's loads
_DECODER_LOCK = threading.Lock()
_decoder_installed: bool | None = None   # once tried: whether it is


@contextlib.contextmanager
def _schema_decoded() -> Iterator[None]:
    """While torch deserializes a program in this thread, decode its JSON into torch's schema
    dataclasses with a ``SchemaDecoder`` (every type planned once) instead of torch's
    ``_dict_to_dataclass`` (which works each value's type out again: ~0.3 s of a 0.85 s load of
    1,000 tensors); other threads' and the user's own torch loads are left to torch's."""
    if not _install_schema_decoder():
        yield
        return
    before = getattr(_DECODING, "active", False)
    _DECODING.active = True
    try:
        yield
    finally:
        _DECODING.active = before


def _install_schema_decoder() -> bool:
    """Route torch's ``_dict_to_dataclass`` through a ``SchemaDecoder`` for the threads in
    ``_schema_decoded``, once per process; False, and torch's left as it is, where its source is
    not the one ported (``DECODER_PORTS``) or cannot be read."""
    global _decoder_installed
    if _decoder_installed is not None:
        return _decoder_installed
    with _DECODER_LOCK:
        if _decoder_installed is None:
            _decoder_installed = _route_decoder()
    return _decoder_installed


def _route_decoder() -> bool:
    from ..schema_decoding import SchemaDecoder

    try:
        import torch.export.pt2_archive._package as package  # private: it imported the decoder by name
        from torch._export.serde import serialize  # private: the serializer's JSON decoder
        from torch._export.serde.union import _Union, _UnionTag  # private: the schema's tagged unions
    except ImportError:   # another torch's layout: its own decoder
        return False
    original = getattr(serialize, "_dict_to_dataclass", None)
    resolve = getattr(serialize, "_resolve_schema_cls", None)
    if original is None or resolve is None or getattr(package, "_dict_to_dataclass", None) is not original:
        return False
    if _source_digest(original, resolve) not in DECODER_PORTS or not hasattr(serialize, "schema"):
        return False
    decoder = SchemaDecoder(vars(serialize.schema), _Union, _union_constructor(_Union, _UnionTag))

    def dict_to_dataclass(cls: Any, data: Any) -> Any:
        if getattr(_DECODING, "active", False):
            return decoder.decode(cls, data)
        return original(cls, data)

    dict_to_dataclass.torch_original = original  # type: ignore[attr-defined]
    serialize._dict_to_dataclass = package._dict_to_dataclass = dict_to_dataclass
    return True


def _source_digest(*functions: Any) -> str | None:
    """sha256 of what the functions *do*: their source parsed and printed again without
    comments, docstrings or type annotations (``_behaviour``), so a torch release that only
    annotates or re-documents a ported function keeps the fast path; None when the source
    cannot be read or parsed."""
    import inspect

    try:
        text = "\n".join(_behaviour(inspect.getsource(f)) for f in functions)
    except (OSError, TypeError, SyntaxError, ValueError):
        return None
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _behaviour(source: str) -> str:
    """``source`` (one function or class, maybe indented) as ``ast.unparse`` prints it with
    every annotation, docstring and comment removed."""
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(source))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            node.returns = None
            for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs,
                        node.args.vararg, node.args.kwarg):
                if arg is not None:
                    arg.annotation = None
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Module)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    for node in list(ast.walk(tree)):  # ``x: T = v`` -> ``x = v``; a bare ``x: T`` says nothing
        for field_name in ("body", "orelse", "finalbody"):
            stmts = getattr(node, field_name, None)
            if isinstance(stmts, list):
                kept = [ast.Assign(targets=[s.target], value=s.value, lineno=s.lineno) if isinstance(s, ast.AnnAssign)
                        and s.value is not None else s for s in stmts
                        if not (isinstance(s, ast.AnnAssign) and s.value is None)]
                setattr(node, field_name, kept or [ast.Pass()])
    return ast.unparse(tree)


_RESERVED_UNION_FIELDS = ("type", "_type", "create", "value")


def _union_constructor(base: Any, tag_type: Any) -> Any:
    """For a tagged union class of torch's schema, a function ``(tag, value)`` building what
    ``cls.create(**{tag: value})`` builds, without ``create``'s work per object. ``create``
    passes every field (None but the tag's) to the dataclass ``__init__`` and sets ``_type``;
    ``__post_init__`` only checks that no field has a reserved name, which depends on the class
    alone (checked once, here). So the object is made with exactly those attributes, in that
    order. A class that could behave otherwise (an ``__init__`` not generated by ``dataclass``,
    its own ``__new__``, ``__setattr__``, ``__post_init__`` or slots; a reserved field name),
    a tag that is not a field, or a torch whose ``create`` is not the one ported
    (``UNION_PORTS``) goes through ``create``."""
    import dataclasses

    from ..schema_decoding import union_create

    ported = _source_digest(base.create, base.__post_init__, tag_type.create) in UNION_PORTS
    make_tag, new = tag_type.create, object.__new__

    def constructor(cls: Any) -> Any:
        create = union_create(cls)
        try:
            names = [f.name for f in dataclasses.fields(cls)]
        except TypeError:   # not a dataclass: create says what is wrong, when it is used
            return create
        init = vars(cls).get("__init__")
        plain = (ported and getattr(getattr(init, "__code__", None), "co_filename", None) == "<string>"
                 and cls.__new__ is object.__new__ and cls.__setattr__ is object.__setattr__
                 and cls.__post_init__ is base.__post_init__ and not hasattr(cls, "__slots__")
                 and not any(n in _RESERVED_UNION_FIELDS for n in names))
        if not plain:
            return create
        blank = dict.fromkeys(names)

        def build(tag: str, value: Any) -> Any:
            if tag not in blank:
                return create(tag, value)   # raises as create does
            obj = new(cls)
            state = blank.copy()
            state[tag] = value
            obj.__dict__.update(state)
            obj._type = make_tag(tag, cls)
            return obj
        return build
    return constructor
