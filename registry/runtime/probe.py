"""Read the live machine into a ``Target``::

    t = probe("cuda:0", imports=["mylib.ops"])
    t.device_type, t.compute_capability, "mylib::myop" in t.custom_ops   # -> ('cuda', (9, 0), True)

Op libraries and modules given here are loaded first, so the target lists the custom ops they
register (that is how ``--import`` makes a bundle with custom ops verify).
"""
from __future__ import annotations

import platform
import re
import sys
from typing import Sequence

from ..errors import IncompatibleError, UsageError
from .target import OpInfo, Target

__all__ = ["probe", "default_device", "parse_device"]

_DEVICE = re.compile(r"^([a-z_][a-z0-9_]*)(?::(\d+))?$")


def parse_device(device: str) -> tuple[str, int | None]:
    """``"cuda:1"`` -> ("cuda", 1); a clear UsageError for anything else."""
    m = _DEVICE.match(device or "")
    if not m:
        raise UsageError(f"invalid device {device!r}", hint="use a torch device like cpu, cuda or cuda:1")
    return m.group(1), int(m.group(2)) if m.group(2) is not None else None


def default_device() -> str:
    """``cuda:0`` when this machine has a usable CUDA (or ROCm) GPU, else ``cpu``."""
    from .torchrt import cuda_available

    return "cuda:0" if cuda_available() else "cpu"


def probe(device: str | None = None, imports: Sequence[str] = (), libraries: Sequence[str] = (), *,
          cpu_isa: bool = True, ops: Sequence[str] | None = None) -> Target:
    """Describe this process's runtime for ``device`` (default: ``default_device()``).

    ``imports``/``libraries`` register custom ops first. ``cpu_isa=False`` skips the CPU ISA
    detection (it compiles a probe program); it matters only for AOTInductor CPU variants.
    ``ops`` (dispatcher names such as ``ns::op``) limits the custom-op table to those ops.
    Raises IncompatibleError when the device type is not usable here (e.g. cuda without a GPU).
    """
    from . import torchrt as rt

    rt.load_libraries(list(libraries))
    rt.import_modules(list(imports))
    t = rt.torch()
    device = device or default_device()
    device_type, index = parse_device(device)
    _check_available(t, device, device_type, index)
    cc = rt.cuda_capability(index) if device_type == "cuda" else None
    ops = {name: OpInfo(info["schema"], tuple(info["dispatch_keys"]))
           for name, info in rt.registered_custom_ops(ops).items()}
    return Target(
        torch_version=str(t.__version__),
        serde_schema=rt.serde_schema_version(),
        device_type=device_type,
        compute_capability=cc,
        cuda_version=t.version.cuda,
        rocm_version=rt.hip_version(),
        platform=sys.platform,
        machine=platform.machine(),
        cpu_isa=rt.cpu_isa() if cpu_isa else None,
        custom_ops=ops,
        torchbind_classes=tuple(rt.torchbind_classes()),
    )


def _check_available(t, device: str, device_type: str, index: int | None) -> None:
    if device_type in ("cpu", "meta"):
        return
    module = getattr(t, device_type, None)
    is_available = getattr(module, "is_available", None)
    if not callable(is_available) or not is_available():
        raise IncompatibleError(
            f"device {device} is not available on this machine (torch {t.__version__})",
            hint="check the device, or verify against a machine description with --target FILE.json")
    count = getattr(module, "device_count", lambda: 1)()
    if index is not None and index >= count:
        raise IncompatibleError(f"device {device} is not available: this machine has {count} {device_type} device(s)")
