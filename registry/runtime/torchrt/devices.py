"""Devices: AOTInductor's CPU ISA naming, the C++ ABI, CUDA/HIP availability and capability,
moving a program or a value to a device."""
from __future__ import annotations

import platform
import re
from typing import TYPE_CHECKING, Any

from ...errors import brief
from .version import torch

if TYPE_CHECKING:
    pass


__all__ = ['cpu_isa', 'cxx11_abi', 'cuda_capability', 'cuda_available', 'device_available', 'hip_version', 'move_to_device', 'device_unavailable', 'to_device']


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
    from ..device import Device

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


def to_device(value: Any, device: Any) -> Any:
    """Every tensor in a (nested) value moved to ``device`` (a ``Device`` or its text)."""
    from torch.utils._pytree import tree_map  # private

    t = torch()
    where = str(device)
    return tree_map(lambda v: v.to(where) if isinstance(v, t.Tensor) else v, value)
