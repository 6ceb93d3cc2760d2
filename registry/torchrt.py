"""The one module that touches torch internals (private APIs behind small functions).

Everything here imports torch lazily; a torch upgrade that moves a private API breaks this file
only. Callers: the bundler (live ExportedPrograms, sample outputs), the target probe and the
loader.
"""
from __future__ import annotations

import contextlib
import importlib
import logging

import os
import platform
import sys
import warnings
from typing import Any, Iterator

from .errors import IntegrityError, NotFoundError, UsageError, brief

__all__ = [
    "torch", "save_exported_program", "dim_names_of", "op_schema", "load_exported_program",
    "load_inputs_file", "flatten_outputs", "environment", "import_modules", "load_libraries",
    "quiet_torch", "torch_loading", "restore_guards",
]


def torch():  # noqa: D103 - the lazy import itself
    import torch as _torch

    return _torch


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
def torch_loading(what: str, hint: str) -> Iterator[None]:
    """Run a torch deserialization quietly; any failure of torch's becomes one
    ``IntegrityError`` line naming ``what`` (torch's own message can be pages long)."""
    try:
        with quiet_torch():
            yield
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:
        raise IntegrityError(f"torch could not load {what}: {type(exc).__name__}: {brief(exc, 200)}",
                             hint=hint) from exc


def load_exported_program(path: str | os.PathLike, archive_name: str = "model") -> Any:
    """Deserialize one program from a verified, pickle-scanned `.pt2` file."""
    torch()
    from torch.export.pt2_archive._package import load_pt2  # private: multi-program archives

    with torch_loading(f"program {archive_name!r} from {path}",
                       "the program is damaged or was written by an incompatible torch"), open(path, "rb") as f:
        contents = load_pt2(f)
    try:
        return contents.exported_programs[archive_name]
    except KeyError as exc:
        raise IntegrityError(f"program {archive_name!r} is not in {path}") from exc


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
    from .pt2.guards import GuardError, compile_guards

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
    from torch.utils._pytree import tree_flatten

    leaves, _ = tree_flatten(out)
    return leaves


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


