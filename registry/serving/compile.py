"""``pt2reg compile``: AOTInductor packages for this machine, proven, published as version N+1.

For each portable program of a version: compile it for the device (weights beside the library
so they dedup against the portable program's chunks, ``torchrt.AOTI_OPTIONS``), add the
packages as variants to a copy of the version's bundle (``registry.bundler.add_variants``: the
original programs, variants, samples and metadata are kept), load that bundle on the device
choosing the new variants and run every golden sample; only if all pass is it published, with
``--parent`` = the source version and ``compiled.<variant>`` metadata (torch, target, options).
For example (``registry`` an open ``Registry``)::

    result = compile_version(registry, "team/m@3", device="cpu")
    result.ref, result.uploaded_bytes
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, RegistryError, UsageError
from ..pt2.verdicts import verdicts_dir
from ..runtime.device import Device, DeviceLike

if TYPE_CHECKING:
    from ..client.api import Registry

__all__ = ["CompiledVariant", "CompileResult", "compile_version", "store_growth"]


@dataclass(frozen=True)
class CompiledVariant:
    program: str
    variant: str
    target: dict[str, str]       # the package's AOTI_* metadata
    seconds: float
    size: int                    # bytes of the package member


@dataclass(frozen=True)
class CompileResult:
    ref: str                     # NAME@N+1
    digest: str
    parent: str                  # NAME@N
    device: str                  # where it was compiled and checked (``str(Device)``)
    variants: tuple[CompiledVariant, ...]
    samples: tuple[Any, ...]     # registry.runtime.loader.SampleResult, all ok
    uploaded_bytes: int          # what the store grew by (chunks it did not hold)
    skipped_bytes: int           # chunks already stored (the portable weights, the old members)
    new_member_bytes: int        # size of the variant members added

    def to_json(self) -> dict[str, Any]:
        return {"ref": self.ref, "digest": self.digest, "parent": self.parent, "device": self.device,
                "variants": [dataclasses.asdict(v) for v in self.variants],
                "samples": [s.to_json() for s in self.samples],
                "store_growth": {"uploaded_bytes": self.uploaded_bytes, "skipped_bytes": self.skipped_bytes,
                                 "variant_bytes": self.new_member_bytes}}


def store_growth(old: Any, new: Any) -> tuple[int, int]:
    """(bytes of chunks in manifest ``new`` that ``old`` lacks, bytes of the members ``new`` adds)."""
    def chunks(m: Any) -> dict[str, int]:
        out: dict[str, int] = {}
        for member in m.members:
            for sha, size in (member.chunks or ((member.sha256, member.size),)):
                out[sha] = size
        return out

    have, now = chunks(old), chunks(new)
    added = {m.path for m in new.members} - {m.path for m in old.members}
    return sum(n for sha, n in now.items() if sha not in have), \
        sum(m.size for m in new.members if m.path in added)


def compile_version(registry: Registry, ref: str, *, programs: Sequence[str] = (), device: DeviceLike = "cpu",
                    name: str | None = None, aliases: Sequence[str] = (), sign_key: str | None = None,
                    require_signature: Sequence[str] = (), progress: Any = None) -> CompileResult:
    """Compile ``ref``'s portable programs (``programs``: some of them) for ``device`` on this
    machine, check the golden samples on the new variants and publish ``name`` (default: the
    same model) N+1 with ``--parent ref``. Nothing is published when a sample fails (exit 1)."""
    from ..bundler import add_variants, aoti_target, aoti_variant_id
    from ..runtime import torchrt
    from ..runtime.loader import load_bundle
    from ..runtime.probe import probe
    from ..runtime.sandbox import SandboxConfig

    device = Device.parse(device)
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {device}: compile for cpu or cuda[:N]")
    target = probe(device, cpu_isa=True)  # exit 4 here when the device is absent
    src = registry.materialize(ref, require_signature=require_signature)
    manifest = src.manifest
    wanted = list(programs) or [n for n, p in manifest.programs.items() if p.portable is not None]
    for p in wanted:
        if p not in manifest.programs:
            raise UsageError(f"{ref} has no program {p!r}; programs: {', '.join(manifest.programs)}")
        if manifest.programs[p].portable is None:
            raise UsageError(f"program {p!r} of {ref} has no portable program to compile")
    parent = f"{src.name}@{src.version}" if src.name and src.version else ref
    from ..runtime.compat import aoti_mismatch

    for p in wanted:  # before minutes of compiling: a variant for this target is already there
        have = [v.id for v in manifest.programs[p].variants
                if v.kind == "aoti" and aoti_mismatch(v.target, target, device.type) is None]
        if have:
            raise ConflictError(f"program {p!r} of {parent} already has variant {have[0]} for this target",
                                hint="compile on a machine of another kind (another GPU), or run the variant it has")
    work = Path(tempfile.mkdtemp(prefix="pt2reg-compile-"))
    try:
        packages, compiled = [], []
        for p in wanted:
            portable = manifest.programs[p].portable
            assert portable is not None
            out = work / f"{p}.aoti.pt2"
            started = time.monotonic()
            meta = torchrt.aoti_compile(src.member_file(portable.member), portable.archive_name, out, device,
                                        label=parent, program=p)
            vid = aoti_variant_id(aoti_target(meta))
            if manifest.programs[p].variant(vid) is not None:
                raise ConflictError(f"program {p!r} of {parent} already has variant {vid} for this target",
                                    hint="compile on a machine of another kind, or run the variant it has")
            packages.append((p, out))
            compiled.append(CompiledVariant(p, vid, meta, round(time.monotonic() - started, 2), out.stat().st_size))
        info = {"torch": torchrt.environment().get("torch"), "device": str(device), "from": parent,
                "target": target.summary(), "options": torchrt.AOTI_OPTIONS}
        meta_keys = {f"compiled.{c.program}.{c.variant}": json.dumps({**info, "aoti": c.target}, sort_keys=True,
                                                                       default=str) for c in compiled}
        bundle = work / "compiled.pt2b"
        built = add_variants(bundle, manifest, {m.path: src.member_file(m.path) for m in manifest.members}, packages, metadata=meta_keys,
                             vetted_dir=verdicts_dir(registry.cache_dir))  # the push below skips the check
        opened = registry.open_file(bundle)
        # we compiled these libraries ourselves, just now (native code allowed), but their first
        # load is still the sandbox child's (unless PT2REG_SANDBOX=off): torch's own AOTInductor
        # loader has crashed on a benign package (torch 2.11, an H100), which here becomes one
        # line, exit 5, nothing published, instead of this process dying
        loaded = load_bundle(opened, device=device, target=target, programs=wanted, trust_native=True,
                             sandbox=SandboxConfig.from_env(registry.settings.cache_dir))
        chosen = {n: loaded[n].variant.id for n in wanted}
        for c in compiled:
            if chosen[c.program] != c.variant:
                raise RegistryError(f"program {c.program!r}: the loader chose {chosen[c.program]}, not the new "
                                    f"variant {c.variant} ({loaded.report.choices[c.program][1]}); nothing published")
        results = loaded.run_samples()
        bad = [r for r in results if not r.ok]
        if bad:
            raise RegistryError(f"{len(bad)} of {len(results)} golden sample(s) failed on the compiled variants, "
                                f"first {bad[0].name}: {bad[0].error or 'outputs outside tolerance'}; nothing published")
        _, added = store_growth(manifest, built.manifest)
        pushed = registry.push(bundle, name or src.name or "", aliases=aliases, parents=[parent],
                               detect_git=False, sign_key=sign_key, progress=progress)
        return CompileResult(pushed.ref, built.manifest.digest, parent, str(device), tuple(compiled), tuple(results),
                             pushed.uploaded_bytes, pushed.skipped_bytes, added)
    finally:
        shutil.rmtree(work, ignore_errors=True)
