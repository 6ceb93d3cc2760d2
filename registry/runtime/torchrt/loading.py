"""Saving and loading ``.pt2`` programs (``torch.export``): a load inside the registry's weights
mapping and schema decoding, errors translated to the registry's, export guards restored."""
from __future__ import annotations

import contextlib
import os
from collections.abc import Collection, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from ...errors import IncompatibleError, IntegrityError, NotFoundError, UsageError, brief
from .decoding import _schema_decoded
from .devices import device_unavailable
from .mapping import WeightsNotVerified, _weights_mapped
from .pytrees import module_to_import, pytree_missing
from .version import quiet_torch, torch

if TYPE_CHECKING:
    from ...blobs.inplace import InPlaceSegment


__all__ = ['save_exported_program', 'dim_names_of', 'load_exported_program', 'load_inputs_file', 'torch_loading', 'restore_guards']


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
    from ...pt2.guards import GuardError, compile_guards

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
