"""Conformance attestation runs: ``verify`` and the golden samples of one version, on this machine.

``pt2reg attest REF --label L`` calls :func:`run_attestation` and then records the outcome
with ``Registry.record_attestation`` (signed with ``--sign KEY``). The run reuses what
``pt2reg verify`` and ``pt2reg run --samples`` do: the same materialize (trust policy and
``--require-signature`` enforced), probe, compatibility check, load (sandboxed first load) and
sample comparison. Anything that goes wrong after the bundle is on this machine (not
compatible, pickled members, a load failure, a sample outside tolerance, no samples at all) is
a *failed* attestation, recorded like a passed one; a failed attestation never satisfies a
policy. For example (``reg`` an open ``Registry``)::

    run = run_attestation(reg, "team/m@4", device="cuda:0")
    run.passed, run.target["compute_capability"]   # -> (True, [9, 0])
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RegistryError
from ..refs import Ref
from .device import DeviceLike

if TYPE_CHECKING:
    from ..client import Registry
    from ..store.records import VersionRecord
    from .target import Target

__all__ = ["AttestRun", "run_attestation", "attested_target"]

_DRIVER = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?(\d+(?:\.\d+)+)")


@dataclass(frozen=True)
class AttestRun:
    """What one attestation run found: the verdict, the device it ran on, the probed target,
    per-check results (``verify`` first, then one per golden sample with per-output max
    abs/rel error) and, when it failed, why (one line)."""

    version: VersionRecord
    passed: bool
    device: str
    target: dict[str, Any]
    results: list[dict[str, Any]]
    error: str | None = None


def _nvidia_driver() -> str | None:
    """The NVIDIA kernel driver's version on Linux, when there is one."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text("utf-8", errors="replace")
    except OSError:
        return None
    m = _DRIVER.search(text)
    return m.group(1) if m else None


def _json_safe(value: Any) -> Any:
    """``value`` with NaN and infinities as text (``"nan"``, ``"inf"``): the registry stores
    canonical JSON, which has no such numbers (a NaN output is an error worth recording)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def attested_target(t: Target) -> dict[str, Any]:
    """The part of a probed target an attestation records (no op table)."""
    return {"torch": t.torch_version, "serde_schema": list(t.serde_schema), "device_type": t.device_type,
            "compute_capability": list(t.compute_capability) if t.compute_capability else None,
            "cuda": t.cuda_version, "rocm": t.rocm_version,
            "driver": _nvidia_driver() if t.device_type == "cuda" else None,
            "platform": t.platform, "machine": t.machine, "cpu_isa": t.cpu_isa}


def run_attestation(registry: Registry, ref: str, *, device: DeviceLike | None = None,
                    imports: Sequence[str] = (), libraries: Sequence[str] = (),
                    require_signature: Sequence[str] = (), trust_pickle: bool = False,
                    trust_native: bool = False) -> AttestRun:
    """Resolve ``ref`` once, fetch that exact version, verify it against this machine and run
    its golden samples on ``device`` (default: cuda:0 if available, else cpu). Errors before
    the bundle is here (not found, trust policy, a device this machine lacks) raise; errors
    after it make a failed run."""
    from .loader import load_bundle, needed_operators, needs_cpu_isa, verify_bundle
    from .probe import probe, resolve_device
    from .sandbox import SandboxConfig

    dev = resolve_device(device)  # a bad --device is exit 2 before anything is fetched
    version = registry.resolve(ref)
    src = registry.materialize(Ref(version.name, version=version.number),
                               require_signature=list(require_signature))
    t = probe(dev, imports, libraries, cpu_isa=needs_cpu_isa(src.manifest), operators=needed_operators(src.manifest))
    target = attested_target(t)
    results: list[dict[str, Any]] = []
    try:
        report = verify_bundle(src, device=dev, target=t, trust_pickle=trust_pickle,
                               trust_native=trust_native)
        results.append({"check": "verify", "ok": report.compatible,
                        "errors": [f.message for f in report.errors]})
        report.raise_for_status()
        if not src.manifest.samples:
            return AttestRun(version, False, str(dev), target, results,
                             "the bundle has no golden samples to attest")
        sandbox = SandboxConfig.from_env(registry.cache_dir, imports=imports, libraries=libraries)
        bundle = load_bundle(src, device=dev, target=t, trust_pickle=trust_pickle,
                             trust_native=trust_native, sandbox=sandbox)
        samples = bundle.run_samples()
    except RegistryError as exc:
        return AttestRun(version, False, str(dev), target, results, exc.one_line())
    results.extend(_json_safe({"check": "sample", **r.to_json()}) for r in samples)
    bad = [r for r in samples if not r.ok]
    error = (f"{len(bad)} of {len(samples)} sample(s) failed, first {bad[0].name}: "
             f"{bad[0].error or 'outputs outside tolerance'}") if bad else None
    return AttestRun(version, not bad and bool(samples), str(dev), target, results, error)
