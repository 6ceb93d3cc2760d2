"""Golden samples: inputs and the outputs computed at bundle time, stored pickle-free.

A sample member is a safetensors file with tensors ``input.<i>`` (the program's flat user
inputs, in signature order) and ``output.<j>`` (flat outputs, with the dtypes the program
computed them in). Reading it never unpickles. The manifest's ``Sample.device`` records the
device type they were computed on: the device the program was exported on when the bundling
machine has it, else the CPU (``sample_device``).

Tolerances. Checked on the CPU, a sample computed on the CPU is compared within its own
``rtol``/``atol``. Wherever a GPU is on either side (computed on one, or checked on one), the
numbers legitimately differ by more: cuDNN convolutions use TF32 by default, cuBLAS and CPU
kernels sum in other orders, and one GPU model picks other algorithms than another. Each
output is then compared within the larger of the sample's tolerance and
``CROSS_DEVICE_TOLERANCES`` for its dtype (README "GPUs", "Golden samples across devices").
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from ..errors import IntegrityError, UsageError
from ..format.manifest import ProgramSpec, Sample
from .device import CPU, Device, DeviceLike
from .inputs import call_arguments
from .torchrt import device_available, flatten_outputs, to_device, torch

__all__ = ["run_program", "write_sample", "read_sample", "compare_outputs", "exported_device", "sample_device",
           "sample_tolerance", "CROSS_DEVICE_TOLERANCES"]

#: (rtol, atol) floors per output dtype when a GPU computed a sample or checks it. float32:
#: torch's own tests allow 5e-3 for TF32 convolutions; half types: a few roundings at their
#: precision (bfloat16 keeps 8 bits, float16 11); float8 formats: 3-4 bits.
CROSS_DEVICE_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-5, 1e-8), "complex128": (1e-5, 1e-8),
    "float32": (5e-3, 5e-3), "complex64": (5e-3, 5e-3),
    "float16": (1e-2, 1e-2), "bfloat16": (5e-2, 5e-2),
    "float8_e4m3fn": (0.25, 0.25), "float8_e5m2": (0.5, 0.5), "float8_e4m3fnuz": (0.25, 0.25),
    "float8_e5m2fnuz": (0.5, 0.5), "float8_e8m0fnu": (1.0, 1.0),
}


def exported_device(program: ProgramSpec) -> Device:
    """The device a program was exported on: the first device other than the CPU that its
    weights, baked arguments, inputs or outputs name (a model moved to ``cuda:0`` before
    ``torch.export``), else the CPU."""
    named = [b.device for b in program.baked_devices] + [t.device for t in (*program.inputs, *program.outputs)
                                                         if t.device]
    for text in named:
        d = Device.try_parse(text)
        if d is not None and not d.is_cpu and d.type != "meta":
            return d
    return CPU


def sample_device(program: ProgramSpec) -> Device:
    """Where golden samples are computed at bundle time: the device the program was exported
    on when this machine has it (a GPU export bundled on the GPU box), else the CPU (a GPU
    export bundled by a CPU-only CI job: the program is moved to the CPU, as the loader moves
    it to whatever device runs it)."""
    d = exported_device(program)
    return d if not d.is_cpu and device_available(d) else CPU


def sample_tolerance(sample: Sample, run_on: DeviceLike, dtype: str) -> tuple[float, float]:
    """(rtol, atol) for one output of ``sample`` (its dtype ``dtype``) checked on ``run_on``:
    the sample's own, widened to ``CROSS_DEVICE_TOLERANCES[dtype]`` when a GPU computed it or
    checks it (or it was computed on another device type than ``run_on``)."""
    computed = Device.try_parse(sample.device or "cpu") or CPU
    here = Device.parse(run_on)
    if computed.type == here.type == "cpu" or here.type == "meta":
        return sample.rtol, sample.atol
    floor = CROSS_DEVICE_TOLERANCES.get(dtype)
    if floor is None:  # integers, bool: exact everywhere
        return sample.rtol, sample.atol
    return max(sample.rtol, floor[0]), max(sample.atol, floor[1])


def run_program(module: Any, program: ProgramSpec, value: Any, device: DeviceLike | None = None) -> list[Any]:
    """Run a loaded program's module on user inputs (as ``call_arguments`` reads them), moved
    to ``device`` first when one is given."""
    args, kwargs = call_arguments(program, value)
    if device is not None:
        args, kwargs = to_device((args, kwargs), device)
    with torch().no_grad():
        out = module(*args, **kwargs)
    return flatten_outputs(out)


def _plain(t: Any) -> Any:
    return t.detach().to("cpu").contiguous().clone()


def write_sample(path: str | os.PathLike, inputs: list[Any], outputs: list[Any]) -> tuple[list[str], list[str]]:
    from safetensors.torch import save_file

    t = torch()
    tensors: dict[str, Any] = {}
    for kind, values in (("input", inputs), ("output", outputs)):
        for i, v in enumerate(values):
            if kind == "output" and isinstance(v, (bool, int, float)):
                v = t.tensor(v)  # a program may return a size (an int): kept as a 0-d tensor
            if not isinstance(v, t.Tensor):
                raise UsageError(f"sample {kind} {i} is a {type(v).__name__}; samples hold tensors only")
            tensors[f"{kind}.{i}"] = _plain(v)
    save_file(tensors, os.fspath(path))
    return ([f"input.{i}" for i in range(len(inputs))], [f"output.{i}" for i in range(len(outputs))])


def read_sample(path: str | os.PathLike, input_keys: list[str], output_keys: list[str], *,
                label: str | None = None) -> tuple[list, list]:
    """Inputs and outputs of a golden sample file; ``label`` names it in errors (the user's
    bundle or ref and the member, not the cache file it was read from)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    where = label or f"sample file {path}"
    try:
        tensors = load_file(os.fspath(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise IntegrityError(f"{where} is unreadable: {exc}") from exc
    try:
        return [tensors[k] for k in input_keys], [tensors[k] for k in output_keys]
    except KeyError as exc:
        raise IntegrityError(f"{where} lacks tensor {exc.args[0]!r}") from exc


def compare_outputs(actual: list[Any], expected: list[Any], rtol: float, atol: float,
                    tolerance: Callable[[str], tuple[float, float]] | None = None) -> list[dict[str, Any]]:
    """Per output: max abs / rel error and whether it is within tolerance: ``rtol``/``atol``,
    or ``tolerance(dtype)`` per output when given (``sample_tolerance``); each row says which."""
    t = torch()
    rows = []
    if len(actual) != len(expected):
        return [{"output": "count", "ok": False, "max_abs": None, "max_rel": None,
                 "detail": f"got {len(actual)} outputs, expected {len(expected)}"}]
    for i, (a, e) in enumerate(zip(actual, expected)):
        a = t.tensor(a) if isinstance(a, (bool, int, float)) else a.detach().to("cpu")
        row: dict[str, Any] = {"output": i, "shape": list(e.shape), "dtype": str(e.dtype).replace("torch.", "")}
        rtol_i, atol_i = tolerance(row["dtype"]) if tolerance is not None else (rtol, atol)
        row.update(rtol=rtol_i, atol=atol_i)
        if a.shape != e.shape or a.dtype != e.dtype:
            row.update(ok=False, max_abs=None, max_rel=None,
                       detail=f"got {list(a.shape)} {a.dtype}, expected {list(e.shape)} {e.dtype}")
        elif a.numel() == 0:
            row.update(ok=True, max_abs=0.0, max_rel=0.0)
        elif e.is_floating_point() or e.is_complex():
            diff = (a.double() - e.double()).abs()
            rel = diff / e.double().abs().clamp_min(1e-12)
            row.update(ok=bool(t.allclose(a, e, rtol=rtol_i, atol=atol_i, equal_nan=True)),
                       max_abs=float(diff.max()), max_rel=float(rel.max()))
        else:
            same = bool(t.equal(a, e))
            row.update(ok=same, max_abs=0.0 if same else float((a.long() - e.long()).abs().max()),
                       max_rel=0.0 if same else None)
        rows.append(row)
    return rows
