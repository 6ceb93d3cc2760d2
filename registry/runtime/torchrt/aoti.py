"""AOTInductor: loading a compiled package, and compiling one (``pt2reg compile``)."""
from __future__ import annotations

import contextlib
import importlib
import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ...errors import IncompatibleError, IntegrityError, brief
from .devices import cxx11_abi, move_to_device
from .loading import load_exported_program, torch_loading
from .pytrees import tree_unflatten
from .version import quiet_torch, torch

if TYPE_CHECKING:
    pass


__all__ = ['load_aoti', 'AOTI_OPTIONS', 'aoti_compile']


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
    from ..device import Device

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
    from ...pt2.reader import open_pt2

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
