"""The torch adapter: the one module that touches torch's private APIs, behind small functions.

Everything private (``torch._C``, ``torch._export``, ``torch._inductor``, ``torch.utils._pytree``,
``torch.export.pt2_archive._package``, private attributes of an ``ExportedProgram``) is reached
from here only, and ``tests/unit/test_torch_adapter.py`` keeps it so. torch is imported lazily,
so importing this module is free; a torch upgrade that moves a private API breaks this file
only. Callers: the bundler (live ExportedPrograms, sample outputs), the target probe, the
loader, its sandbox and the sample checks.

* programs: save, load (``.pt2``, its weights mapped or copied, and AOTInductor), move between
  devices, export guards;
* the dispatcher: which ops exist, their schemas, which dispatch keys have kernels, TorchBind
  classes, every registered schema (for ``registry.pt2.op_effects``);
* the serializer's schema version, its JSON decoding (``schema_decoding``, inside the
  registry's loads), AOTInductor's CPU ISA naming, the CUDA/HIP runtime;
* pytrees: flatten, unflatten, treespecs, stand-ins for library output classes.

    >>> has_kernel("aten::add.Tensor", "CPU")                  # doctest: +SKIP
    True
"""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import logging

import os
import platform
import posixpath
import re
import sys
import threading
import warnings
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Collection, Iterable, Iterator, Mapping

from ..errors import IncompatibleError, InputValidationError, IntegrityError, NotFoundError, UsageError, brief
from ..pt2.graph import BUILTIN_OP_NAMESPACES
from ..pt2.op_effects import OpSchema

if TYPE_CHECKING:
    from ..blobs.inplace import InPlaceSegment

__all__ = [
    "torch", "save_exported_program", "dim_names_of", "op_schema", "load_exported_program",
    "load_inputs_file", "flatten_outputs", "environment", "import_modules", "load_libraries",
    "quiet_torch", "torch_loading", "restore_guards",
    "DISPATCH_KEYS", "serde_schema_version", "has_kernel", "registered_custom_ops", "all_op_schemas",
    "op_schema_digests",
    "torchbind_classes", "cpu_isa", "cxx11_abi", "cuda_capability", "cuda_available", "device_available",
    "hip_version",
    "move_to_device", "device_unavailable", "load_aoti", "bind_call", "to_device",
    "tree_flatten", "tree_unflatten", "treespec_loads",
    "PytreeStandIn", "pytree_registered", "stand_in_pytree_classes", "pytree_missing", "module_to_import",
    "AOTI_OPTIONS", "aoti_compile",
]


_torch_checked = False   # whether this process's torch passed ``check_torch_version``


def torch():  # noqa: D103 - the lazy import itself
    import torch as _torch

    global _torch_checked
    if not _torch_checked:
        check_torch_version(str(_torch.__version__))
        _torch_checked = True
    return _torch


def check_torch_version(version: str) -> None:
    """IncompatibleError (exit 4) for a torch older than the oldest supported release
    (``registry.pt2.window.FLOOR``, pyproject's ``torch>=``): its serializer and private APIs
    are not the ones this code reads, so it is refused in one line rather than half-working.
    A newer torch is allowed: the compatibility window decides per program, and the decoder
    fast paths fall back to torch's own code when its source differs."""
    from ..pt2.window import FLOOR, RELEASES

    m = re.match(r"^(\d+)\.(\d+)", version)
    if m is None:
        return  # a build without a version number: nothing to compare
    floor = tuple(int(p) for p in FLOOR.split("."))
    if (int(m.group(1)), int(m.group(2))) < floor:
        newest = max(RELEASES, key=lambda r: tuple(int(p) for p in r.split(".")))
        raise IncompatibleError(f"torch {version} is older than pt2-registry supports (torch {FLOOR} to {newest})",
                                hint=f"upgrade torch: pip install 'torch>={FLOOR}'")


def save_exported_program(ep: Any, path: str | os.PathLike) -> None:
    """Save a live ExportedProgram without torch's pickled example inputs."""
    t = torch()
    saved_inputs = ep.example_inputs
    try:
        ep.example_inputs = None
        t.export.save(ep, os.fspath(path))
    finally:
        ep.example_inputs = saved_inputs


def dim_names_of(ep: Any, dynamic_shapes: Any) -> dict[str, str]:
    """Map graph symbols (``s27``) to the user's ``Dim`` names, from the export-time spec."""
    if dynamic_shapes is None or ep.example_inputs is None:
        return {}
    try:
        from torch._export.serde.dynamic_shapes import _dump_dynamic_shapes  # private
        from torch.utils._pytree import tree_flatten

        args, kwargs = ep.example_inputs
        dumped = _dump_dynamic_shapes(dynamic_shapes, args, kwargs, to_dict=True)["dynamic_shapes"]
        per_input, _ = tree_flatten(dumped, is_leaf=lambda x: isinstance(x, list)
                                    and all(isinstance(d, (str, int)) or d is None for d in x))
        user_inputs = [n for n in ep.graph.nodes if n.op == "placeholder"
                       and n.name in set(ep.graph_signature.user_inputs)]
    except Exception:  # the spec is optional metadata; never fail a bundle over it
        return {}
    names: dict[str, str] = {}
    for node, dims in zip(user_inputs, per_input):
        val = node.meta.get("val")
        shape = getattr(val, "shape", None)
        if shape is None or not isinstance(dims, list):
            continue
        for size, dim in zip(shape, dims):
            expr = getattr(getattr(size, "node", None), "expr", None)
            if isinstance(dim, str) and expr is not None and getattr(expr, "is_Symbol", False):
                names[str(expr)] = dim
    return names


def op_schema(target: str) -> str | None:
    """The schema string of a registered op (``torch.ops.ns.op.overload``), else None."""
    if "torch" not in sys.modules:
        return None
    parts = target.split(".")
    if len(parts) != 5:
        return None
    try:
        packet = getattr(getattr(torch().ops, parts[2]), parts[3])
        return str(getattr(packet, parts[4])._schema)
    except (AttributeError, RuntimeError):
        return None


def import_modules(modules: list[str] | tuple[str, ...]) -> None:
    """Import modules that register custom ops (``--import``)."""
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception as exc:
            raise UsageError(f"cannot import {mod!r}: {type(exc).__name__}: {exc}",
                             hint="check the module name and that it is on PYTHONPATH") from exc


def load_libraries(paths: list[str] | tuple[str, ...]) -> None:
    """Load compiled custom-op libraries (``--load-library PATH.so``)."""
    for path in paths:
        if not os.path.isfile(path):
            raise UsageError(f"op library {path!r} not found")
        try:
            torch().ops.load_library(path)
        except Exception as exc:
            raise UsageError(f"cannot load op library {path!r}: {exc}") from exc


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Keep torch's deserialization warnings and log lines off the user's terminal: our own
    checks already said what matters, and a failure becomes one line of ours."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


@contextlib.contextmanager
def torch_loading(what: str, hint: str, hide: tuple[Any, Any] | None = None) -> Iterator[None]:
    """Run a torch deserialization quietly; any failure of torch's becomes one
    ``IntegrityError`` line naming ``what`` (torch's own message can be pages long).
    ``hide``: (internal path, user label): the path is replaced by the label in torch's text."""
    try:
        with quiet_torch():
            yield
    except (MemoryError, KeyboardInterrupt, WeightsNotVerified):
        raise
    except Exception as exc:
        missing = pytree_missing(exc)
        if missing:  # not damage: a library class this process has not registered
            raise IncompatibleError(
                f"cannot load {what}: it returns or takes {missing}, a pytree class not registered here "
                f"and not one the registry can stand in for",
                hint=f"import the module that registers it: --import {module_to_import(missing)}") from None
        unusable = device_unavailable(exc)
        if unusable:
            raise IncompatibleError(f"cannot load {what} on this machine: {unusable}",
                                    hint="run it where that device is available, or pass --device for one "
                                         "this machine has (a portable program moves to any device)") from exc
        text = brief(exc, 200)
        if hide and hide[0]:
            text = text.replace(os.fspath(hide[0]), hide[1] or "the archive")
        raise IntegrityError(f"torch could not load {what}: {type(exc).__name__}: {text}",
                             hint=hint) from exc


class WeightsNotVerified(Exception):
    """torch was about to read a record of the archive whose bytes are not verified yet (a
    cold load overlapping the fetch of the weights, see ``load_exported_program``): wait for
    the fetch, then load again. Never reaches a user."""


def load_exported_program(path: str | os.PathLike, archive_name: str = "model", label: str | None = None,
                          program: str | None = None, map_weights: bool = False,
                          unverified: Collection[str] = frozenset(),
                          elsewhere: Iterable[InPlaceSegment] = ()) -> Any:
    """Deserialize one program from a verified, pickle-scanned `.pt2` file.

    ``label`` names the file for the user in errors (their bundle file or ref, their `.pt2`),
    never the cache blob or temp copy at ``path``; without one, errors name no file.
    ``program``: the program's name for the user (default ``archive_name``, torch's own).
    ``map_weights``: back the raw weights and constants with a private (copy-on-write) map of
    ``path`` instead of copies, as ``torch.load(mmap=True)`` does: no 2 GiB copy at load, pages
    read on first use and shared with every process that loads the same cached file. Only for a
    file that is never written in place while mapped (the client cache: files are replaced by
    rename, and a changed one is re-hashed, not reused); see ``_mapped_file_map``.
    ``unverified`` (with ``map_weights``): records (``data/weights/weight_3``) whose bytes are
    still being fetched and verified into ``path``. Deserializing maps them and reads none, so
    it may run meanwhile; anything that would read one (a record torch copies: a pickled one,
    one not aligned to its dtype, one whose device is not the CPU) raises
    ``WeightsNotVerified`` before the read, and the caller waits and loads again.
    ``elsewhere`` (with ``map_weights``): records whose bytes are not in ``path`` but in a local
    store's file (``blobs.inplace``: a segment per record, its offset and size the record's);
    each is mapped from that file, opened again and found unchanged (``WeightsNotVerified``
    otherwise: the caller then loads a complete copy).
    """
    torch()
    from torch.export.pt2_archive._package import load_pt2  # private: multi-program archives

    where = f" from {label}" if label else ""
    with torch_loading(f"program {program or archive_name!r}{where}",
                       "the program is damaged or was written by an incompatible torch",
                       hide=(path, label)), open(path, "rb") as f, \
            _weights_mapped(f if map_weights else None, frozenset(unverified), elsewhere), _schema_decoded():
        contents = load_pt2(f)
    try:
        return contents.exported_programs[archive_name]
    except KeyError as exc:
        raise IntegrityError(f"program {archive_name!r} is not in {label or 'the archive'}") from exc


_MAPPING = threading.local()  # this thread's mapped file while load_pt2 runs, else unset


@contextlib.contextmanager
def _weights_mapped(f: Any, unverified: frozenset[str] = frozenset(),
                    elsewhere: Iterable[InPlaceSegment] = ()) -> Iterator[None]:
    """While ``load_pt2`` reads ``f`` in this thread: every weight and constant is placed on the
    CPU, whatever device the file names (``_on_host``: a program exported on a GPU deserializes
    on a machine without one, and nothing here initializes a GPU; the loader then moves the
    program to the device that runs it); with ``f``, the weights are built over a map of ``f``
    (the records ``elsewhere`` places over maps of their own files); reading a record in
    ``unverified`` raises ``WeightsNotVerified`` instead."""
    installed = _install_mapped_file_map()
    if unverified:
        _install_read_guard()
        _MAPPING.unverified = unverified
    _MAPPING.elsewhere = {s.offset: s for s in elsewhere}
    _MAPPING.host = installed
    try:
        if f is None or not installed:
            if unverified or _MAPPING.elsewhere:  # torch copies every weight: each must be verified first
                raise WeightsNotVerified("weights are copied, not mapped")
            yield
            return
        with _file_mapped(f, unverified):
            yield
    finally:
        _MAPPING.unverified = frozenset()
        _MAPPING.elsewhere = {}
        _MAPPING.host = False


def _on_host(config: Any) -> None:
    """Every tensor record of a payload config (weights, constants) placed on the CPU: the
    device in its ``tensor_meta`` is rewritten before torch's loader (or ours) reads it. Only the
    graph's metadata keeps the exporting device, which ``move_to_device`` rewrites."""
    from torch._export.serde.schema import Device  # private: the serializer's device record

    for meta in config.config.values():
        tensor_meta = meta.tensor_meta
        if tensor_meta is not None and getattr(tensor_meta.device, "type", "cpu") != "cpu":
            tensor_meta.device = Device(type="cpu", index=None)


@contextlib.contextmanager
def _file_mapped(f: Any, unverified: frozenset[str]) -> Iterator[None]:
    size = os.fstat(f.fileno()).st_size
    # the open file itself (its inode), not its path: a file renamed over it meanwhile is not mapped
    same = f"/proc/self/fd/{f.fileno()}" if os.path.isdir("/proc/self/fd") else os.fspath(f.name)
    _MAPPING.path = same  # where record sizes are read when torch's reader cannot say them
    try:
        _MAPPING.storage = torch().UntypedStorage.from_file(same, shared=False, nbytes=size) if size else None
    except (RuntimeError, OSError) as exc:  # a file system that cannot map: torch's copy
        logging.getLogger(__name__).debug("weights not mapped (%s): copying them", exc)
        _MAPPING.storage = None
        if unverified:  # the copy would read bytes not verified yet
            raise WeightsNotVerified(f"cannot map {f.name}: {exc}") from None
    try:
        yield
    finally:
        _MAPPING.storage = _MAPPING.path = None


def _install_mapped_file_map() -> bool:
    """Route torch's ``_build_file_map`` (raw payload record -> flat tensor) through
    ``_mapped_file_map`` (records on the CPU, mapped where the thread maps a file) once per
    process; False if this torch has no such function (then weights are copied, as torch
    does, onto the devices the file names)."""
    import torch.export.pt2_archive._package as package  # private: the payload loader

    original = getattr(package, "_build_file_map", None)
    if original is None:
        return False
    if not getattr(original, "registry_mapped", False):
        def build_file_map(archive_reader: Any, config: Any, base_dir: str) -> dict[str, Any]:
            if getattr(_MAPPING, "host", False):  # one of the registry's loads (this thread)
                _on_host(config)
            storage = getattr(_MAPPING, "storage", None)
            unverified = getattr(_MAPPING, "unverified", frozenset())
            elsewhere = getattr(_MAPPING, "elsewhere", {})
            mapped = None if storage is None else _mapped_file_map(archive_reader, config, base_dir, storage,
                                                                   unverified, elsewhere)
            if mapped is None and unverified:  # torch's loader copies every record it lists
                for meta in config.config.values():
                    _check_verified(os.path.join(base_dir, meta.path_name), unverified)
            return original(archive_reader, config, base_dir) if mapped is None else mapped

        build_file_map.registry_mapped = True  # type: ignore[attr-defined]
        package._build_file_map = build_file_map
    return True


def _check_verified(record: str, unverified: frozenset[str]) -> None:
    """``WeightsNotVerified`` if reading archive record ``record`` would read unverified bytes."""
    if unverified and posixpath.normpath(record) in unverified:
        raise WeightsNotVerified(f"record {record} is not verified yet")


def _install_read_guard() -> None:
    """Make torch's archive reader refuse, once per process, to read a record this thread's
    load marked unverified (``_MAPPING.unverified``): every record torch reads outside
    ``_build_file_map`` goes through ``PT2ArchiveReader.read_bytes``."""
    import torch.export.pt2_archive._package as package  # private: the archive reader

    reader = package.PT2ArchiveReader
    original = reader.read_bytes
    if getattr(original, "registry_guarded", False):
        return

    def read_bytes(self: Any, name: str) -> bytes:
        _check_verified(name, getattr(_MAPPING, "unverified", frozenset()))
        return original(self, name)

    read_bytes.registry_guarded = True  # type: ignore[attr-defined]
    reader.read_bytes = read_bytes


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
    from .schema_decoding import SchemaDecoder

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

    from .schema_decoding import union_create

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


def _mapped_file_map(archive_reader: Any, config: Any, base_dir: str, storage: Any,
                     unverified: frozenset[str] = frozenset(),
                     elsewhere: Mapping[int, InPlaceSegment] | None = None) -> dict[str, Any] | None:
    """torch's ``_build_file_map`` with each raw record a view of ``storage`` (a map of the
    whole archive) at the record's data offset instead of a copy; None (torch's own loader then
    copies them all, or reports what is wrong) if a record is not aligned to its dtype, does not
    lie inside the file, or has no tensor metadata, or if neither this torch's archive reader nor
    the archive's central directory says where each record lies (torch 2.11's reader has no
    ``get_record_size``: ``_directory_spans``). A record ``elsewhere`` holds (by its offset and
    size) is a view of a map of that segment's file instead (``_segment_storage``)."""
    t = torch()
    from torch._export.serde.serialize import (  # private: the serializer's decoders
        deserialize_device, deserialize_scalar_type, deserialize_size)

    reader, planned = archive_reader.archive_file, []
    offset_of = getattr(reader, "get_record_offset", None)
    size_of = getattr(reader, "get_record_size", None)
    spans = None  # torch 2.11's reader has no sizes: (offset, size) from the central directory
    if offset_of is None or (size_of is None and (spans := _directory_spans(storage.nbytes())) is None):
        return None
    for meta in config.config.values():
        if meta.use_pickle:  # torch.load's, after this map is built (read through read_bytes)
            continue
        if meta.tensor_meta is None:  # malformed: torch's own loader says so
            return None
        dtype = deserialize_scalar_type(meta.tensor_meta.dtype)
        record = os.path.join(base_dir, meta.path_name)
        try:
            offset = offset_of(record)
            nbytes = size_of(record) if spans is None else spans[record][1]
        except (KeyError, RuntimeError):  # a record the archive does not hold: torch says so
            return None
        if spans is not None and spans[record][0] != offset:  # no view is ever misplaced
            return None
        width = t._utils._element_size(dtype)
        if nbytes and (nbytes % width or offset % width or offset < 0 or offset + nbytes > storage.nbytes()):
            return None
        planned.append((meta, dtype, width, offset, nbytes))
    file_map: dict[str, Any] = {}
    files: dict[str, Any] = {}  # path -> map of a store file holding records in place
    starts = sorted(elsewhere) if elsewhere else []
    for meta, dtype, width, offset, nbytes in planned:
        if meta.path_name in file_map:
            continue
        tensor_meta = meta.tensor_meta
        if nbytes == 0:
            tensor = t.zeros(deserialize_size(tensor_meta.sizes), dtype=dtype)
        else:
            base, at = storage, offset
            if elsewhere:  # the file at ``storage`` lacks these bytes: never view it there
                segments = _segments_of(elsewhere, starts, offset, nbytes, record=meta.path_name)
                if len(segments) == 1:  # at the same offset modulo 16 (inplace.ALIGN)
                    base, at = _segment_storage(segments[0], files), segments[0].file_offset
                elif segments:  # the pieces of a split tensor, side by side
                    base, at = _pieces_storage(segments), 0
            tensor = t.empty(0, dtype=dtype)
            tensor.set_(base[at:at + nbytes], 0, (nbytes // width,), (1,))
        if tensor_meta.requires_grad:
            tensor.requires_grad_(True)
        device = deserialize_device(tensor_meta.device)
        if device != t.device("cpu"):
            _check_verified(os.path.join(base_dir, meta.path_name), unverified)  # .to() reads it
            tensor = tensor.to(device)
        file_map[meta.path_name] = tensor
    return file_map


def _segments_of(elsewhere: Mapping[int, InPlaceSegment], starts: list[int], offset: int, nbytes: int,
                 record: str) -> list[InPlaceSegment]:
    """The segments that tile the record at ``offset`` (``nbytes``) exactly, in order; none if
    no segment overlaps it; ``WeightsNotVerified`` (load a complete copy) if some overlap it
    without tiling it."""
    k = bisect_left(starts, offset + nbytes) - 1
    found: list[InPlaceSegment] = []
    while k >= 0 and starts[k] + elsewhere[starts[k]].size > offset:
        found.append(elsewhere[starts[k]])
        k -= 1
    found.reverse()
    if found and (found[0].offset != offset or sum(s.size for s in found) != nbytes or
                  any(a.offset + a.size != b.offset for a, b in zip(found, found[1:]))):
        raise WeightsNotVerified(f"record {record} is not tiled by the segments held in place")
    return found


def _pieces_storage(segments: list[InPlaceSegment]) -> Any:
    """One storage over the pieces of a split tensor, each mapped from its own store file."""
    from ..blobs.inplace import map_together

    try:
        region = map_together(segments)
    except OSError as exc:  # NotInPlace among them: a piece is no longer the file first seen
        raise WeightsNotVerified(f"cannot map the pieces of a record: {exc}") from None
    return torch().frombuffer(region, dtype=torch().uint8).untyped_storage()


def _segment_storage(segment: InPlaceSegment, files: dict[str, Any]) -> Any:
    """A private map of the store file ``segment`` lies in (one per file and load), opened by
    descriptor after checking it is still the file its bytes were (or will be) hashed in."""
    from ..blobs.inplace import NotInPlace, open_in_place

    if segment.path not in files:
        try:
            fd = open_in_place(segment.path, segment.identity)
        except NotInPlace as exc:
            raise WeightsNotVerified(str(exc)) from None
        try:
            files[segment.path] = torch().UntypedStorage.from_file(f"/proc/self/fd/{fd}", shared=False,
                                                                   nbytes=segment.identity.size)
        except (RuntimeError, OSError) as exc:
            raise WeightsNotVerified(f"cannot map {segment.path}: {exc}") from None
        finally:
            os.close(fd)
    return files[segment.path]


def _directory_spans(size: int) -> dict[str, tuple[int, int]] | None:
    """``record -> (data offset, size)`` of the archive being mapped (``_MAPPING.path``), from
    its central directory (``zipsafe.canonical_data_spans``), for a torch whose archive reader
    has no ``get_record_size``; None unless the archive is canonical (stored, exact local
    headers). The caller also requires every offset to agree with torch's own."""
    from ..errors import UnsafeArchiveError
    from ..format.zipsafe import canonical_data_spans

    path = getattr(_MAPPING, "path", None)
    if path is None:
        return None
    try:
        with open(path, "rb") as fp:  # a file description of its own: torch's reads are not moved
            spans = canonical_data_spans(fp, size, where=path)
    except (OSError, UnsafeArchiveError):
        return None
    # member names carry the archive's top folder ("model/data/weights/w0"); torch's do not
    return {name.split("/", 1)[1]: (offset, n) for name, offset, n in spans if "/" in name}


def restore_guards(ep: Any) -> Any:
    """Enforce the program's export guards with the registry's own checker, never torch's.

    torch turns ``_guards_code`` (strings from the file, e.g. ``trunc(0.5*x.size(0)) == 4``)
    into a function it ``exec()``s inside ``ep.module()`` when the program carries example
    inputs: code of the file's choosing. Here the strings are parsed by
    ``registry.pt2.guards`` (a closed single-expression grammar, already checked when the graph
    was read), torch's copy is emptied and the example inputs cleared, so torch builds no guard
    function; the module ``ep.module()`` returns carries the parsed guards as
    ``_registry_guards`` and ``LoadedProgram`` checks them on every call before the graph runs.
    """
    from ..pt2.guards import GuardError, compile_guards

    try:
        guards = compile_guards(list(getattr(ep, "_guards_code", None) or []))
    except GuardError as exc:  # the reader refuses these first; kept for defense in depth
        raise IntegrityError(f"program guards refused: {exc}") from exc
    ep._guards_code = []
    ep.example_inputs = None
    make_module = ep.module

    def module(*args: Any, **kwargs: Any) -> Any:
        gm = make_module(*args, **kwargs)
        gm._registry_guards = guards
        return gm

    ep.module = module
    return ep


def load_inputs_file(path: str | os.PathLike) -> Any:
    """Read an INPUTS.pt (a tuple of tensors, or a dict for keyword inputs) without pickle code."""
    t = torch()
    try:
        value = t.load(os.fspath(path), weights_only=True, map_location="cpu")
    except FileNotFoundError as exc:
        raise NotFoundError(f"inputs file {path} not found", what="file", name=str(path)) from exc
    except Exception as exc:
        import pickle

        if isinstance(exc, pickle.UnpicklingError):  # torch's text would suggest weights_only=False
            raise UsageError(f"inputs file {path} holds objects other than tensors; refused (only "
                             f"tensors, tuples, lists and dicts are read, never arbitrary pickles)",
                             hint="save a tuple of tensors with torch.save((x, y), path)") from exc
        raise UsageError(f"cannot read inputs file {path}: {type(exc).__name__}: {brief(exc)}",
                         hint="save a tuple of tensors with torch.save((x, y), path)") from exc
    if isinstance(value, t.Tensor):
        value = (value,)
    if isinstance(value, list):
        value = tuple(value)
    if not isinstance(value, (tuple, dict)):
        raise UsageError(f"inputs file {path} holds a {type(value).__name__}, expected a tuple of tensors")
    return value


def flatten_outputs(out: Any) -> list[Any]:
    """The tensors (and other leaves) of a nested output, in pytree order."""
    return tree_flatten(out)[0]


# -- pytrees ------------------------------------------------------------------------------------

def tree_flatten(value: Any) -> tuple[list[Any], Any]:
    """(leaves, treespec) of a nested value, as torch.export flattens inputs and outputs."""
    from torch.utils._pytree import tree_flatten as flatten  # private

    return flatten(value)


def tree_unflatten(leaves: Iterable[Any], spec: Any) -> Any:
    """The nested value ``spec`` describes, with ``leaves`` in place."""
    from torch.utils._pytree import tree_unflatten as unflatten  # private

    return unflatten(list(leaves), spec)


def treespec_loads(text: str) -> Any:
    """A treespec from its serialized JSON form (``in_spec``/``out_spec`` of a manifest)."""
    from torch.utils._pytree import treespec_loads as loads  # private

    return loads(text)


def environment() -> dict[str, str | None]:
    """python/torch/platform/cuda of this process, without host or user (part of identity)."""
    env: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "torch": None,
        "cuda": None,
    }
    try:
        t = torch()
        env["torch"] = str(t.__version__)
        env["cuda"] = t.version.cuda
    except ImportError:
        pass
    return env


# -- the dispatcher, devices and AOTInductor ------------------------------------------------------

#: Dispatch keys recorded per op in a Target: backends plus the composite keys that serve all.
DISPATCH_KEYS = ("CPU", "CUDA", "HIP", "MPS", "XPU", "Meta", "QuantizedCPU", "QuantizedCUDA",
                 "SparseCPU", "SparseCUDA", "CompositeImplicitAutograd", "CompositeExplicitAutograd",
                 "CompositeExplicitAutogradNonFunctional")
_CLASS_IN_SCHEMA = re.compile(r"(__torch__\.torch\.classes\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+)")


def serde_schema_version() -> tuple[int, int]:
    """(major, minor) of the serializer this torch writes and reads (private constant)."""
    torch()
    from torch._export.serde.schema import SCHEMA_VERSION  # private

    return int(SCHEMA_VERSION[0]), int(SCHEMA_VERSION[1])


def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether ``op`` (``ns::op`` or ``ns::op.overload``) has a kernel for ``dispatch_key``."""
    try:
        return bool(torch()._C._dispatch_has_kernel_for_dispatch_key(op, dispatch_key))  # private
    except RuntimeError:
        return False


def _schema(op: str) -> str | None:
    name, _, overload = op.partition(".")
    try:
        return str(torch()._C._get_schema(name, overload))  # private
    except RuntimeError:
        return None


#: torch modules that register operators from Python when imported (``streams::`` by dynamo,
#: collectives by distributed, ...): imported before every schema is listed, so theirs count.
_REGISTERING_MODULES = (
    "torch._dynamo", "torch._higher_order_ops", "torch._prims", "torch._refs", "torch.export",
    "torch._export.serde.serialize", "torch.distributed", "torch.distributed._functional_collectives",
    "torch.distributed.tensor", "torch._inductor.lowering", "torch.ao.quantization", "torch._library",
)


def all_op_schemas() -> list[OpSchema]:
    """The schema of every operator registered in this process, after importing the parts of
    torch that register operators from Python (for :func:`registry.pt2.op_effects.compute`)."""
    t = torch()  # registers every built-in C++ operator
    for name in _REGISTERING_MODULES:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - an optional part of torch (no distributed build ...)
            pass
    return [OpSchema(name=s.name, overload=s.overload_name,
                     args=tuple((a.name, str(a.type), bool(a.alias_info is not None and a.alias_info.is_write))
                                for a in s.arguments),
                     returns=tuple(str(r.type) for r in s.returns))
            for s in t._C._jit_get_all_schemas()]  # private, stable since 1.x


def registered_custom_ops(only: Iterable[str] | None = None) -> dict[str, dict[str, Any]]:
    """Registered ops outside torch's built-in namespaces (or just those named in ``only``):
    schema and the dispatch keys that have kernels. ``only`` keeps a load's probe cheap: a
    full scan asks the dispatcher about every op and key (~4,600 calls)."""
    out: dict[str, dict[str, Any]] = {}
    names = torch()._C._dispatch_get_all_op_names()  # private
    if only is not None:
        names = set(names) & set(only)
    for op in names:
        if op.split("::", 1)[0] in BUILTIN_OP_NAMESPACES:
            continue
        out[op] = {"schema": _schema(op), "dispatch_keys": [k for k in DISPATCH_KEYS if has_kernel(op, k)]}
    return out


def op_schema_digests(only: Iterable[str] | None = None) -> dict[str, str]:
    """``schema_digest`` of the schema of every registered operator (or just those named in
    ``only``, dispatcher names ``ns::op[.overload]``; absent ones are left out), keyed by
    dispatcher name: what a target records for the operator rule (~4,400 operators, ~30 ms)."""
    from .target import schema_digest

    t = torch()
    if only is not None:
        found = ((op, _schema(op)) for op in only)
        return {op: schema_digest(s) for op, s in found if s is not None}
    return {s.name + (f".{s.overload_name}" if s.overload_name else ""): schema_digest(str(s))
            for s in t._C._jit_get_all_schemas()}  # private, stable since 1.x


def torchbind_classes() -> list[str]:
    """Qualified names (``__torch__.torch.classes.ns.Cls``) of registered TorchBind classes."""
    names: set[str] = set()
    for schema in torch()._C._jit_get_custom_class_schemas():  # private; methods take `self` first
        names.update(_CLASS_IN_SCHEMA.findall(str(schema)))
    return sorted(names)


#: inductor's x86 vector ISAs, widest first, each with the CPU features it needs, named as
#: ``str(isa).upper()`` names them in AOTInductor's ``AOTI_CPU_ISA``
_X86_ISAS = (("AVX512 AVX512_VNNI AMX_TILE", ("avx512", "vnni", "amx_tile")),
             ("AVX512 AVX512_VNNI", ("avx512", "vnni")), ("AVX512", ("avx512",)), ("AVX2", ("avx2",)))
#: /proc/cpuinfo flags behind each feature, where torch's own checks are missing
_CPUINFO_FLAGS = {"avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512dq", "avx512vl", "avx512bw"),
                  "vnni": ("avx512_vnni",), "amx_tile": ("amx_tile",)}


def cpu_isa() -> str | None:
    """The CPU's vector ISA named as AOTInductor records it in ``AOTI_CPU_ISA`` (e.g.
    ``"AVX512 AVX512_VNNI"``): the widest of inductor's ISAs whose features this CPU has, read
    from its feature flags (torch's ``cpuinfo`` checks, else ``/proc/cpuinfo``). Nothing is
    compiled: inductor's ``pick_vec_isa`` also compiles a test program per ISA (seconds to
    minutes), which says what this machine's compiler can *build*, not what its CPU can *run*,
    and running a variant is what a target describes. ``ATEN_CPU_CAPABILITY`` is not
    consulted for the same reason. None where the architecture has no ISA inductor names."""
    machine = platform.machine()
    if machine in ("x86_64", "AMD64"):
        have = _x86_features()
        return next((name for name, needs in _X86_ISAS if all(have.get(f) for f in needs)), None)
    if machine in ("aarch64", "arm64"):
        return "ASIMD"   # inductor's NEON and SVE ISAs are both named asimd; every aarch64 has it
    if machine == "ppc64le":
        return "VSX"
    if machine == "s390x":
        return "ZVECTOR" if "vxe" in _cpuinfo_flags() else None
    return None


def _x86_features() -> dict[str, bool]:
    """avx2 / avx512 / vnni / amx_tile, as inductor's ``x86_isa_checker`` asks torch for them."""
    checks = {"avx2": "_is_avx2_supported", "avx512": "_is_avx512_supported", "vnni": "_is_vnni_supported",
              "amx_tile": "_is_amx_tile_supported"}
    cpu = getattr(torch(), "cpu", None)
    flags: set[str] | None = None
    out = {}
    for feature, name in checks.items():
        check = getattr(cpu, name, None)  # private: torch's cpuinfo-backed feature checks
        try:
            out[feature] = bool(check()) if callable(check) else None
        except Exception:  # noqa: BLE001 - an exotic build: the flags decide
            out[feature] = None
        if out[feature] is None:
            flags = _cpuinfo_flags() if flags is None else flags
            out[feature] = all(f in flags for f in _CPUINFO_FLAGS[feature])
    out["vnni"] = bool(out["vnni"] and out["avx512"])
    return out  # type: ignore[return-value]


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("flags", "features"):
                    return set(value.split())
    except OSError:
        pass
    return set()


def cxx11_abi() -> bool | None:
    """Whether this torch was built with libstdc++'s C++11 ABI (what an AOTInductor package's
    C++ is compiled against); None when torch does not say."""
    t = torch()
    public = getattr(t, "compiled_with_cxx11_abi", None)
    flag = public() if callable(public) else getattr(t._C, "_GLIBCXX_USE_CXX11_ABI", None)  # private fallback
    return bool(flag) if flag is not None else None


def cuda_available() -> bool:
    t = torch()
    return bool(t.cuda.is_available())


def device_available(device: Any) -> bool:
    """Whether this process can place tensors on ``device`` (a ``Device``): the CPU and meta
    always; another type when its torch module says it is available (and has the index)."""
    from .device import Device

    dev = Device.parse(device)
    if dev.type in ("cpu", "meta"):
        return True
    module = getattr(torch(), dev.type, None)
    try:
        if module is None or not module.is_available():
            return False
        count = module.device_count() if hasattr(module, "device_count") else 1
    except Exception:  # noqa: BLE001 - a backend that cannot even say: not usable
        return False
    return dev.index is None or dev.index < count


def cuda_capability(index: int | None) -> tuple[int, int]:
    major, minor = torch().cuda.get_device_capability(index)
    return int(major), int(minor)


def hip_version() -> str | None:
    return getattr(torch().version, "hip", None)


def move_to_device(ep: Any, device: Any) -> Any:
    """Rewrite every device in an ExportedProgram (baked constants, weights, the graph's
    tensor metadata) to ``device`` (a ``Device`` or its text). Under ``no_grad``: the pass
    copies fake tensors with ``.to()``, and with autograd recording a fake tensor of a device
    this torch was built without (a CUDA export on a CPU-only torch) aborts the process."""
    t = torch()
    from torch.export.passes import move_to_device_pass

    with t.no_grad():
        return move_to_device_pass(ep, str(device))


#: torch's words when a program names a device this machine or this torch build cannot use
_DEVICE_UNAVAILABLE = re.compile(
    r"not compiled with (?:CUDA|ROCm|HIP|XPU|MPS)|not linked with support for (\w+) devices|"
    r"Found no NVIDIA driver|no CUDA-capable device|CUDA driver version is insufficient|"
    r"No (?:HIP|XPU) GPUs are available|torch\.cuda\.is_available\(\) is False|"
    r"MPS backend is not available|invalid device ordinal", re.I)


def device_unavailable(exc: BaseException) -> str | None:
    """torch's first line when ``exc`` says a device is not usable here (a CUDA program on a
    CPU-only torch, no driver, a missing GPU index), else None: that is exit 4 (the program
    cannot run here), never an integrity verdict."""
    for e in (exc, exc.__cause__, exc.__context__):
        if e is not None and _DEVICE_UNAVAILABLE.search(str(e)):
            return brief(e, 200)
    return None


def load_aoti(path: str | os.PathLike, model_name: str, device: Any, label: str | None = None,
              program: str | None = None) -> Any:
    """Load one model of a verified AOTInductor package onto ``device`` (a ``Device`` or its
    text: ``cuda:1`` -> index 1; ``cuda`` -> the current CUDA device, named explicitly).
    ``label`` names the package for the user in errors (never the cache blob at ``path``).

    Through ``load_pt2`` itself, not ``load_package``: that one catches any ``RuntimeError`` of
    the loader, logs "Loading outdated pt2 file" and loads the package again with torch's legacy
    loader, hiding the first error behind whatever the legacy loader does with a current package.
    For CUDA the context is made and the device selected first. The package is read by path
    (a link named ``*.pt2``: cache blobs have no suffix, and a buffer would be copied whole to
    a temporary file by torch)."""
    from .device import Device

    t = torch()
    from torch.export.pt2_archive._package import load_pt2  # private: the runners by model name

    # torch 2.10's loader reads ``torch._inductor.codecache`` without importing it: an
    # AttributeError in a process that compiled nothing (the sandbox's child, a server)
    importlib.import_module("torch._inductor.codecache")
    dev = Device.parse(device)
    index = dev.index
    if dev.type == "cuda" and t.cuda.is_available():
        t.cuda.init()  # the CUDA context exists before the package's library and kernels load
        index = int(t.cuda.current_device()) if index is None else index
        t.cuda.set_device(index)
    what = f"AOTInductor model {program or model_name!r}" + (f" from {label}" if label else "")
    with torch_loading(what, "the package is damaged or was compiled for another torch or machine",
                       hide=(path, label)), _named_pt2(path) as named:
        runners = load_pt2(named, device_index=index if index is not None else -1).aoti_runners
    if model_name not in runners:
        raise IntegrityError(f"{what}: the package holds no model {model_name!r} (it holds {sorted(runners)})")
    return runners[model_name]


@contextlib.contextmanager
def _named_pt2(path: str | os.PathLike) -> Iterator[str]:
    """``path`` under a name ending in ``.pt2`` (a symbolic link in a private directory), as
    torch's package loader wants it; the path itself where it already ends so."""
    import shutil
    import tempfile

    where = os.fspath(path)
    if where.endswith(".pt2"):
        yield where
        return
    folder = tempfile.mkdtemp(prefix="pt2reg-aoti-")
    try:
        link = os.path.join(folder, "package.pt2")
        try:
            os.symlink(os.path.abspath(where), link)
        except OSError:  # no symbolic links here: a copy
            shutil.copyfile(where, link)
        yield link
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def bind_call(args: tuple, kwargs: dict, in_spec: str | None,
              arg_names: list[str] | None = None) -> tuple[list[Any], tuple, dict]:
    """Match a call to the program's input treespec: (flat leaves, args, kwargs) in its order.

    Positional parameters passed by keyword (``model(x=t)``) are moved into place by name, and
    keyword arguments are reordered as exported. A structure that cannot match raises
    InputValidationError naming what the program takes.
    """
    if not in_spec:
        return [*args, *kwargs.values()], tuple(args), dict(kwargs)
    spec = treespec_loads(in_spec)
    n_pos = spec.child(0).num_children
    want_kw = list(spec.child(1).context or [])
    args, kwargs = list(args), dict(kwargs)
    for pname in (arg_names or [])[len(args):n_pos]:
        if pname not in kwargs:
            break
        args.append(kwargs.pop(pname))
    positional = (arg_names or [])[:n_pos] if len(arg_names or []) >= n_pos else [f"{n_pos} positional"]
    expected = ", ".join([*positional, *want_kw])
    if len(args) != n_pos or set(kwargs) != set(want_kw):
        got = [f"{len(args)} positional", *sorted(kwargs)]
        raise InputValidationError(f"the program takes ({expected}), got ({', '.join(got)})")
    kwargs = {k: kwargs[k] for k in want_kw}
    flat, got_spec = tree_flatten((tuple(args), kwargs))
    if got_spec != spec:
        raise InputValidationError(f"the inputs' nesting does not match the program's: expected {spec}")
    return flat, tuple(args), kwargs


def to_device(value: Any, device: Any) -> Any:
    """Every tensor in a (nested) value moved to ``device`` (a ``Device`` or its text)."""
    from torch.utils._pytree import tree_map  # private

    t = torch()
    where = str(device)
    return tree_map(lambda v: v.to(where) if isinstance(v, t.Tensor) else v, value)


# -- library pytree classes (transformers ModelOutput, registered dataclasses) ------------------

#: stand-ins this process registered, by serialized type name
_STAND_INS: dict[str, Any] = {}


class PytreeStandIn(dict):
    """What a program returns in place of a library output class that is not imported here
    (e.g. ``transformers.modeling_outputs.CausalLMOutputWithCrossAttentions``): a dict with the
    same fields, readable as ``out["logits"]``, ``out.logits`` and, like ``ModelOutput``,
    ``out[0]``. It pickles as a plain dict. ``type(out).serialized_type_name`` names the class."""

    serialized_type_name: str = ""
    fields: tuple[str, ...] = ()

    def __getattr__(self, name: str) -> Any:
        if name in type(self).fields or name in self:
            return self.get(name)
        raise AttributeError(f"{type(self).__name__} has no field {name!r}")

    def __getitem__(self, key: Any) -> Any:
        if isinstance(key, int):
            return list(self.values())[key]
        return dict.__getitem__(self, key)

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())

    def __reduce__(self) -> Any:
        return (dict, (dict(self),))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict.__repr__(self)})"


def pytree_registered(serialized_name: str) -> bool:
    """Whether torch can deserialize this pytree type name in this process now (the real class,
    imported by the user, or a stand-in registered earlier). Never imports anything."""
    mod = sys.modules.get("torch.utils._pytree")  # private: pytree registry
    if mod is None:
        return False
    return serialized_name in getattr(mod, "SERIALIZED_TYPE_TO_PYTHON_TYPE", {})


def stand_in_pytree_classes(classes: list[dict[str, Any]]) -> list[str]:
    """Before torch deserializes a program: register a :class:`PytreeStandIn` under each
    serialized type name torch cannot resolve here, so the program loads without the library.

    ``classes`` come from the manifest (``ProgramSpec.pytree_classes``: type, fields, style).
    A class already registered (the user imported its module, e.g. ``--import
    transformers.modeling_outputs``) is left alone: the real class is used. Nothing is ever
    imported because a manifest names it. Returns the names stood in for; a class whose context
    is not a list of field names (``fields`` None) is skipped (the compat rule refuses it)."""
    torch()
    from torch.utils import _pytree as pytree  # private: serialized-name registration

    done = []
    for c in classes:
        name, fields, style = c.get("type"), c.get("fields"), c.get("style")
        if not name or fields is None or pytree_registered(name):
            continue
        short = name.rsplit(".", 1)[-1]
        cls = type(short if short.isidentifier() else "PytreeStandIn", (PytreeStandIn,),
                   {"serialized_type_name": name, "fields": tuple(fields), "__module__": __name__,
                    "__qualname__": f"PytreeStandIn[{name}]"})

        if style == "dataclass":
            def flatten(obj: Any) -> tuple[list[Any], Any]:
                keys = [k for k in type(obj).fields if obj.get(k) is not None]
                nones = [k for k in type(obj).fields if obj.get(k) is None]
                return [obj[k] for k in keys], [keys, nones]

            def unflatten(values: Any, context: Any, cls: Any = cls) -> Any:
                keys, nones = context
                out = cls(zip(keys, values))
                out.update(dict.fromkeys(nones))
                return out
        else:
            def flatten(obj: Any) -> tuple[list[Any], Any]:
                keys = [k for k in obj if obj[k] is not None]
                return [obj[k] for k in keys], keys

            def unflatten(values: Any, context: Any, cls: Any = cls) -> Any:
                return cls(zip(context, values))

        def flatten_with_keys(obj: Any, flatten: Any = flatten) -> tuple[list[Any], Any]:
            values, context = flatten(obj)
            keys = context[0] if style == "dataclass" else context
            return [(pytree.MappingKey(k), v) for k, v in zip(keys, values)], context

        pytree.register_pytree_node(cls, flatten, unflatten, serialized_type_name=name,
                                    flatten_with_keys_fn=flatten_with_keys)
        _STAND_INS[name] = cls
        done.append(name)
    return done


_NOT_REGISTERED = re.compile(r"Deserializing (\S+) in pytree is not registered|"
                             r"deserialize TreeSpec of namedtuple class (\S+) because")


def pytree_missing(exc: BaseException) -> str | None:
    """The serialized type name in torch's "Deserializing X in pytree is not registered"."""
    for e in (exc, exc.__cause__, exc.__context__):
        m = _NOT_REGISTERED.search(str(e)) if e is not None else None
        if m:
            return (m.group(1) or m.group(2)).rstrip(".")
    return None


def module_to_import(serialized_name: str) -> str:
    """The module a serialized pytree type name comes from (``a.b.C`` -> ``a.b``)."""
    return serialized_name.rsplit(".", 1)[0] if "." in serialized_name else serialized_name


# -- AOTInductor compile (``pt2reg compile``) ---------------------------------------------------

#: Inductor options ``pt2reg compile`` uses: the weights go beside the library, raw and back to
#: back in ``*_weights.blob``, so the bundler chunks each at the portable program's weight and
#: the variant's weights dedup against it in the store (``pickle_weights`` crashed loading).
AOTI_OPTIONS: dict[str, Any] = {"aot_inductor.package_constants_in_so": False,
                                "aot_inductor.package_constants_on_disk_format": "binary_blob"}


def aoti_compile(path: str | os.PathLike, archive_name: str, out: str | os.PathLike, device: Any,
                 label: str | None = None, program: str | None = None,
                 options: dict[str, Any] | None = None) -> dict[str, str]:
    """Compile one program of a verified `.pt2` with AOTInductor for ``device`` into the
    single-model package ``out`` (model name "model", as Triton's PyTorch backend loads it).
    Returns the package's ``AOTI_*`` and ``PT2REG_*`` (compiling torch, C++ ABI) target metadata,
    read from the package's own metadata JSON
    (what the bundler reads), not by loading it here: torch's loader has crashed this process
    on a benign CUDA package (torch 2.11 on an H100), and the caller vets the first load in the
    sandbox child."""
    t = torch()
    ep = load_exported_program(path, archive_name, label=label, program=program)
    # weights load on the CPU; the graph may name the device it was exported on: all to ``device``
    ep = move_to_device(ep, device)
    # normalized bundles drop the example inputs; inductor wants some, on the device
    ep.example_inputs = _example_inputs(ep)
    what = f"program {program or archive_name!r}" + (f" of {label}" if label else "")
    configs = dict(options or AOTI_OPTIONS)
    if options is None and not (ep.state_dict or ep.constants):
        # no weights: torch's loader fails mapping an empty weights file ("mmap() failed", 2.13)
        configs = {}
    # which torch compiled it and its C++ ABI, in the package's own metadata (the bundler's
    # ``aoti_target`` records them): the runtime must match both
    abi = cxx11_abi()
    configs["aot_inductor.metadata"] = {**configs.get("aot_inductor.metadata", {}), "PT2REG_TORCH": str(t.__version__),
                                        **({"PT2REG_CXX11_ABI": "1" if abi else "0"} if abi is not None else {})}
    try:
        with quiet_torch():
            t._inductor.aoti_compile_and_package(ep, package_path=os.fspath(out), inductor_configs=configs)
    except Exception as exc:  # a compiler error: one line naming the program
        raise IncompatibleError(f"AOTInductor could not compile {what} for {device}: "
                                f"{type(exc).__name__}: {brief(exc, 300)}",
                                hint="check the C++ compiler (gcc) and, for CUDA, nvcc and the driver") from exc
    from ..pt2.reader import open_pt2

    models = open_pt2(out, where=f"the AOTInductor package compiled from {what}", describe=False).aoti
    if list(models) != ["model"]:
        raise IncompatibleError(f"AOTInductor compiled {what} into models {sorted(models)}, expected one "
                                f"named 'model'")
    return {k: v for k, v in models["model"]["metadata"].items() if k.startswith(("AOTI_", "PT2REG_"))}


def _example_inputs(ep: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """Zero tensors of each user input's dtype and (hinted) shape, placed as the in_spec says."""
    t = torch()
    from torch.export.graph_signature import InputKind

    names = {s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT}
    leaves = []
    for node in ep.graph.nodes:
        if node.op == "placeholder" and node.name in names:
            val = node.meta.get("val")
            if isinstance(val, t.Tensor):
                shape = [_size_hint(ep, d) for d in val.shape]
                leaves.append(t.zeros(shape, dtype=val.dtype, device=val.device))
            else:
                leaves.append(val)
    args, kwargs = tree_unflatten(leaves, ep.call_spec.in_spec)
    return tuple(args), dict(kwargs)


def _size_hint(ep: Any, size: Any) -> int:
    """A concrete size for one dim of an example input: its hint, else within its range."""
    t = torch()
    if not isinstance(size, t.SymInt):
        return int(size)
    if size.node.hint is not None:
        return int(size.node.hint)
    vr = ep.range_constraints.get(size.node.expr)
    low = int(vr.lower) if vr is not None else 2
    high = int(vr.upper) if vr is not None and vr.upper.is_finite else low + 2
    return max(low, min(2, high))
