"""Read the live machine into a ``Target``, and decide the default device::

    t = probe("cuda:0", imports=["mylib.ops"])
    t.device_type, t.compute_capability, "mylib::myop" in t.custom_ops   # -> ('cuda', (9, 0), True)
    resolve_device(None)   # -> Device('cuda', 0) on a GPU host, Device('cpu') elsewhere

Op libraries and modules given here are loaded first, so the target lists the custom ops they
register (that is how ``--import`` makes a bundle with custom ops verify). Nothing here compiles
or runs code: the CPU's vector ISA comes from its feature flags (``torchrt.cpu_isa``), so a probe
costs a few dispatcher queries after ``import torch`` (and the CUDA context, for a GPU).
"""
from __future__ import annotations

import platform
import sys
from collections.abc import Sequence

from ..errors import IncompatibleError
from .device import CPU, Device, DeviceLike
from .target import OpInfo, Target

__all__ = ["probe", "default_device", "resolve_device"]


def default_device() -> Device:
    """``cuda:0`` when this machine has a usable CUDA (or ROCm) GPU, else ``cpu``: the one
    default policy of ``pt2reg run``/``verify``/``attest``/``target`` and ``registry.load``."""
    from .torchrt import cuda_available

    return Device("cuda", 0) if cuda_available() else CPU


def resolve_device(requested: DeviceLike | None) -> Device:
    """The device named (parsed: ``UsageError`` for a bad one), else ``default_device()``."""
    return Device.parse(requested) if requested is not None else default_device()


def probe(device: DeviceLike | None = None, imports: Sequence[str] = (), libraries: Sequence[str] = (), *,
          cpu_isa: bool = True, ops: Sequence[str] | None = None,
          operators: Sequence[str] | None = None) -> Target:
    """Describe this process's runtime for ``device`` (default: ``default_device()``).

    ``imports``/``libraries`` register custom ops first. ``cpu_isa=False`` leaves the CPU ISA
    out of the target (it matters only for AOTInductor CPU variants; reading it is cheap).
    ``ops`` (dispatcher names such as ``ns::op``) limits the custom-op table to those ops;
    ``operators`` limits the schema digests (``Target.op_schemas``) to those (default: every
    registered operator, ~30 ms).
    Raises IncompatibleError when the device type is not usable here (e.g. cuda without a GPU).
    """
    from . import torchrt as rt

    rt.load_libraries(list(libraries))
    rt.import_modules(list(imports))
    t = rt.torch()
    dev = resolve_device(device)
    _check_available(t, dev)
    cc = rt.cuda_capability(dev.index) if dev.type == "cuda" else None
    ops = {name: OpInfo(info["schema"], tuple(info["dispatch_keys"]))
           for name, info in rt.registered_custom_ops(ops).items()}
    return Target(
        torch_version=str(t.__version__),
        serde_schema=rt.serde_schema_version(),
        device_type=dev.type,
        compute_capability=cc,
        cuda_version=t.version.cuda,
        rocm_version=rt.hip_version(),
        platform=sys.platform,
        machine=platform.machine(),
        cpu_isa=rt.cpu_isa() if cpu_isa else None,
        custom_ops=ops,
        torchbind_classes=tuple(rt.torchbind_classes()),
        op_schemas=rt.op_schema_digests(operators),
        cxx11_abi=rt.cxx11_abi(),
    )


def _check_available(t, dev: Device) -> None:
    if dev.type in ("cpu", "meta"):
        return
    module = getattr(t, dev.type, None)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available) or not is_available():
        raise IncompatibleError(
            f"device {dev} is not available on this machine (torch {t.__version__})",
            hint="check the device, or verify against a machine description with --target FILE.json")
    count = getattr(module, "device_count", lambda: 1)()
    if dev.index is not None and dev.index >= count:
        raise IncompatibleError(f"device {dev} is not available: this machine has {count} {dev.type} device(s)")
