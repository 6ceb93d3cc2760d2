"""Can this bundle run on that target? Pure rules over (manifest, target, device).

Each rule returns ``Finding``s (an error blocks loading, a warning does not) that say what is
wrong, why it matters and how to fix it. ``check`` chooses one variant per program, once
(``choose_variants``), hands the choice to the rules that depend on it, and reports everything at
once::

    report = check(manifest, Target.load("box.json"), "cuda:0")
    report.compatible, report.choices["decoder"]
    # -> (True, ('portable', 'portable program: no AOTInductor variant matches ...'))

Variant choice: an AOTInductor variant whose target matches exactly (device key, compute
capability, platform, machine, and a CPU ISA the target supports) wins, since it is the
compiled, faster form; otherwise the portable ExportedProgram, which can be moved to any device.
An AOTInductor variant is native code: the loader passes ``allow_native=False`` unless the
bundle is signed by a trusted key or the user said ``--trust-native``, and then only the
portable program is chosen (with an ``info`` finding saying which variant was passed over).

Which torch can read a portable program is decided by its *window* (``serialization.window``,
computed at bundle time by ``registry.pt2.window`` from what the program uses): a target whose
serde schema minor is older than the window's is refused naming the oldest torch that reads it,
whatever torch wrote the program; torch's own operators it calls must exist on the target with
the schemas they had at export (``operators``, when the target records ``op_schemas``). A
bundle made before windows were recorded falls back to the writer's schema: a newer *minor* is
a warning (minor bumps are additive). A different *major* is always an error. An AOTInductor
variant runs only on the torch major.minor and C++ ABI that compiled it.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ..format.manifest import AotiTarget, Manifest, ProgramSpec, Variant, baked_device_groups
from ..pt2.graph import HARDWARE_DTYPES
from .device import Device, DeviceLike
from .target import Target, schema_digest

__all__ = ["Finding", "CompatReport", "VariantChoice", "check", "choose_variant", "choose_variants",
           "aoti_mismatch", "RULES", "PROCESS_RULES", "ReleaseVerdict", "release_matrix", "device_type_of", "NATIVE_FIX", "pytree_classes_of",
           "serde_schema_rule", "torch_version_rule", "device_type_rule", "hardware_dtype_rule",
           "custom_op_rule", "operator_rule", "torchbind_rule", "aoti_target_rule", "baked_device_rule", "pytree_class_rule",
           "DEVICE_DISPATCH_KEYS", "COMPOSITE_KEYS"]

#: Kernels registered under these keys serve every device.
COMPOSITE_KEYS = frozenset({"CompositeImplicitAutograd", "CompositeExplicitAutograd",
                            "CompositeExplicitAutogradNonFunctional"})
#: The dispatch keys whose kernels run tensors of a device type (ROCm registers under CUDA).
DEVICE_DISPATCH_KEYS = {
    "cpu": ("CPU", "QuantizedCPU", "SparseCPU"),
    "cuda": ("CUDA", "HIP", "QuantizedCUDA", "SparseCUDA"),
    "mps": ("MPS",), "xpu": ("XPU",), "meta": ("Meta",),
}
_MIN_CC = {"bfloat16": (8, 0), "float8_e4m3fn": (8, 9), "float8_e5m2": (8, 9), "float8_e8m0fnu": (10, 0)}
_AMD_ONLY = {"float8_e4m3fnuz", "float8_e5m2fnuz"}
#: A CPU with the key also runs code built for the values (AVX-512 machines run AVX2 code).
_ISA_IMPLIES = {"AVX512": {"AVX2"}, "SVE256": {"ASIMD", "NEON"}, "ASIMD": {"NEON"}}


@dataclass(frozen=True)
class Finding:
    """One problem. ``message`` is a single line naming the thing; ``why``/``fix`` explain."""

    severity: str          # "error" | "warning" | "info" (nothing wrong: a choice explained)
    code: str              # e.g. "custom-op-missing"
    program: str | None
    message: str
    why: str = ""
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "code": self.code, "program": self.program,
                "message": self.message, "why": self.why, "fix": self.fix}


@dataclass(frozen=True)
class CompatReport:
    """Every finding, and per program the variant chosen (once, by ``check``) and why."""

    compatible: bool
    findings: tuple[Finding, ...]
    variants: Mapping[str, VariantChoice] = field(default_factory=dict, hash=False)

    @property
    def choices(self) -> dict[str, tuple[str | None, str]]:
        """Per program, in program order: (the chosen variant id or None: nothing loadable, why)."""
        return {name: (c.variant_id, c.reason) for name, c in self.variants.items()}

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    def raise_for_status(self) -> None:
        """Nothing when compatible; else UnsafeArchiveError (exit 5) when an error is a
        ``pickle`` or ``native-code`` finding, IncompatibleError (exit 4) otherwise: one line
        naming the first error and how many more there are."""
        if self.compatible:
            return
        from ..errors import IncompatibleError, UnsafeArchiveError

        errors = self.errors
        if not errors:
            raise IncompatibleError("not compatible", findings=list(self.findings))
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        unsafe = next((f for f in errors if f.code in ("pickle", "native-code")), None)
        if unsafe is not None:
            raise UnsafeArchiveError(f"refused: {unsafe.message}{more}", hint=unsafe.fix)
        raise IncompatibleError(f"not compatible: {errors[0].message}{more}", findings=list(self.findings))

    def to_json(self) -> dict[str, Any]:
        return {"compatible": self.compatible,
                "findings": [f.to_json() for f in self.findings],
                "variants": {p: {"id": c.variant_id, "reason": c.reason} for p, c in self.variants.items()},
                "program_order": list(self.variants)}  # JSON output sorts keys: the bundle's order


def device_type_of(device: Device | None, target: Target) -> str:
    """The device type a check is for: the device's, else the target's."""
    return device.type if device is not None else target.device_type


def _err(code: str, program: str | None, message: str, why: str = "", fix: str = "") -> Finding:
    return Finding("error", code, program, message, why, fix)


def _warn(code: str, program: str | None, message: str, why: str = "", fix: str = "") -> Finding:
    return Finding("warning", code, program, message, why, fix)


def _describe(t: AotiTarget | None) -> str:
    t = t or AotiTarget()
    parts = [t.device_key or "?"]
    if t.compute_capability:
        parts.append(f"sm_{t.compute_capability}")
    parts += [p for p in (t.platform, t.machine, t.cpu_isa) if p]
    return " ".join(parts)


def _isa_features(isa: str | None) -> set[str]:
    tokens = set((isa or "").upper().split()) - {"INVALID_VEC_ISA"}
    for tok in list(tokens):
        tokens |= _ISA_IMPLIES.get(tok, set())
    return tokens


def aoti_mismatch(vt: AotiTarget | None, target: Target, device_type: str) -> str | None:
    """Why an AOTInductor variant cannot run on the target, or None when it matches exactly."""
    vt = vt or AotiTarget()
    key = vt.device_key or "cpu"
    if key != device_type:
        return f"built for {key}, the target device is {device_type}"
    cc, tcc = vt.compute_capability or None, target.compute_capability_str
    if cc != tcc:
        built = f"built for sm_{cc}" if cc else "built without a recorded compute capability"
        return f"{built}, the target is {'sm_' + tcc if tcc else 'of unknown compute capability'}"
    for attr in ("platform", "machine"):
        want, have = getattr(vt, attr), getattr(target, attr)
        if want and want != have:
            return f"built for {attr} {want}, the target's is {have or 'unknown'}"
    if vt.torch_version and _minor_of(vt.torch_version) != _minor_of(target.torch_version):
        return (f"compiled by torch {vt.torch_version}, the target runs torch {target.torch_version} "
                f"(a package runs only on the torch major.minor that compiled it)")
    if vt.cxx11_abi is not None and target.cxx11_abi is not None and vt.cxx11_abi != target.cxx11_abi:
        return (f"compiled against the {'C++11' if vt.cxx11_abi else 'pre-C++11'} libstdc++ ABI, the target's "
                f"torch uses the {'C++11' if target.cxx11_abi else 'pre-C++11'} one")
    needed = _isa_features(vt.cpu_isa) if key == "cpu" else set()
    if needed:
        if target.cpu_isa is None:
            return f"built for CPU ISA {vt.cpu_isa}, the target's CPU ISA is unknown"
        missing = sorted(needed - _isa_features(target.cpu_isa))
        if missing:
            return f"built for CPU ISA {vt.cpu_isa}, the target lacks {' '.join(missing)}"
    return None


def _minor_of(version: str) -> str:
    """``2.13`` of ``2.13.0+cu130`` (the text itself when it is not a version)."""
    parts = version.split("+")[0].split(".")
    return ".".join(parts[:2])


#: How to allow native code, said wherever an AOTInductor variant is passed over for it.
NATIVE_FIX = ("to allow it, require the publisher's signature (--require-signature KEY, or a trust policy "
              "rule for the model) or pass --trust-native (trust_native=True)")


@dataclass(frozen=True)
class VariantChoice:
    """The variant of one program to load on the target (None: nothing can run there) and why.
    ``passed_over``: an AOTInductor variant that matches the target but was not chosen because
    native code is not allowed (``allow_native=False``)."""

    variant: Variant | None
    reason: str
    passed_over: Variant | None = None

    @property
    def variant_id(self) -> str | None:
        return self.variant.id if self.variant is not None else None


def _choose(program: ProgramSpec, target: Target, device: Device | None, allow_native: bool) -> VariantChoice:
    device_type = device_type_of(device, target)
    rejected, passed_over = [], None
    for v in program.variants:
        if v.kind != "aoti":
            continue
        why_not = aoti_mismatch(v.target, target, device_type)
        if why_not is None and not allow_native:
            rejected.append(f"{v.id} matches the target but is native code from a publisher not trusted here")
            passed_over = passed_over or v
            continue
        if why_not is None:
            return VariantChoice(v, f"AOTInductor variant {v.id} matches the target ({_describe(v.target)})")
        rejected.append(f"{v.id}: {why_not}")
    portable = program.portable
    if portable is None:
        return VariantChoice(None, "no variant can run here: " + "; ".join(rejected), passed_over)
    if not rejected:
        return VariantChoice(portable, "portable program (the bundle has no AOTInductor variant for it)")
    return VariantChoice(portable, "portable program: no AOTInductor variant matches ("
                         + "; ".join(rejected) + ")", passed_over)


def choose_variant(program: ProgramSpec, target: Target, device: DeviceLike | None = None, *,
                   allow_native: bool = True) -> tuple[Variant | None, str]:
    """The variant to load on the target and why (None when no variant can run there).

    ``allow_native=False`` never chooses an AOTInductor variant (a compiled shared library):
    the portable program is used instead, and the reason says which variant was passed over.
    """
    choice = _choose(program, target, Device.parse_optional(device), allow_native)
    return choice.variant, choice.reason


def choose_variants(manifest: Manifest, target: Target, device: DeviceLike | None = None, *,
                    allow_native: bool = True) -> dict[str, VariantChoice]:
    """One ``VariantChoice`` per program, in program order: made once per check or load and
    handed to the rules that depend on it (``CompatReport.variants``)."""
    dev = Device.parse_optional(device)
    return {name: _choose(prog, target, dev, allow_native) for name, prog in manifest.programs.items()}


def pytree_classes_of(program: ProgramSpec) -> list[dict[str, Any]]:
    """Library pytree classes of a program's treespecs (``type``, ``fields``, ``style``), read
    from the treespecs themselves: bundles written before ``pytree_classes`` have them too, and
    the stand-ins need the ``style`` the manifest does not record."""
    from ..pt2.treespec import TreeSpecError, pytree_classes

    found: dict[str, dict[str, Any]] = {}
    for spec in (program.in_spec, program.out_spec):
        try:
            for c in pytree_classes(spec):
                found.setdefault(c["type"], c)
        except TreeSpecError:
            continue
    return list(found.values())


# ---------------------------------------------------------------------------------------- rules

def _choices(manifest: Manifest, target: Target, device: Device | None,
             choices: Mapping[str, VariantChoice] | None) -> Mapping[str, VariantChoice]:
    """The choice ``check`` made; a rule called on its own chooses with native code allowed."""
    return choices if choices is not None else choose_variants(manifest, target, device)


def serde_schema_rule(manifest: Manifest, target: Target, device: Device | None, *,
                      choices: Mapping[str, VariantChoice] | None = None) -> list[Finding]:
    """The portable program's window must admit the target's serde schema: same major, minor at
    least the window's (a bundle without a window: the writer's minor, newer only warns);
    archive version 0."""
    out: list[Finding] = []
    major, minor = target.serde_schema
    choices = _choices(manifest, target, device, choices)
    for name, prog in manifest.programs.items():
        chosen = choices[name].variant
        needed = chosen is None or chosen.kind == "exported_program"
        ser = prog.serialization
        window = ser.window
        pmajor, pminor = window.schema if window is not None else ser.schema_version
        if pmajor != major:
            make = _err if needed else _warn
            out.append(make(
                "serde-schema", name,
                f"program {name!r} was serialized with serde schema {pmajor}.{pminor} (torch "
                f"{ser.torch_version}); torch {target.torch_version} reads schema {major}.x"
                + ("" if needed else "; only its AOTInductor variant can load"),
                "torch.export cannot deserialize an archive written with another schema major version",
                f"run it with a torch whose serde schema major is {pmajor} (like {ser.torch_version}), "
                f"or re-export the model with torch {target.torch_version}"))
        elif pminor > minor and needed and window is not None:
            uses = "; ".join(window.features) or f"serde schema {pmajor}.{pminor}"
            out.append(_err(
                "serde-schema", name,
                f"program {name!r} needs torch >= {window.torch} (serde schema {pmajor}.{pminor}; it uses "
                f"{uses}); torch {target.torch_version} reads up to schema {major}.{minor}",
                f"torch {target.torch_version} cannot read what the program uses, whichever torch exported it "
                f"(torch {ser.torch_version})",
                f"run it with torch >= {window.torch} (pin it on the target), or re-export the model without "
                f"those constructs (or with torch {_minor_of(target.torch_version)})"))
        elif pminor > minor and needed:
            out.append(_warn(
                "serde-minor", name,
                f"program {name!r} uses serde schema {pmajor}.{pminor}, newer than {major}.{minor} of "
                f"torch {target.torch_version}",
                "minor schema bumps are additive; loading fails only if the program uses a newer construct "
                "(the bundle predates recorded windows, so what it uses is not known)",
                f"prefer torch >= {ser.torch_version.split('+')[0]} on the target, or re-bundle it to record "
                f"its window"))
        archive_version = ser.archive_version
        if needed and archive_version not in (None, "0"):
            out.append(_err("archive-version", name,
                            f"program {name!r} has pt2 archive version {archive_version}; torch "
                            f"{target.torch_version} reads version 0",
                            "torch refuses archives of another archive version",
                            "re-export the model with the target's torch"))
    return out


def torch_version_rule(manifest: Manifest, target: Target, device: Device | None) -> list[Finding]:
    """The target torch must satisfy the bundle's PEP 440 requirement."""
    spec_text = manifest.requirements.torch
    if not spec_text:
        return []
    try:
        spec = SpecifierSet(spec_text)
    except InvalidSpecifier:
        return [_warn("torch-version", None, f"the bundle's torch requirement {spec_text!r} is not a "
                      f"PEP 440 specifier; it was not checked", fix="rebuild with --torch-requirement '>=X.Y'")]
    try:
        version = Version(target.torch_version)
    except InvalidVersion:
        return [_warn("torch-version", None, f"target torch version {target.torch_version!r} is not a "
                      f"PEP 440 version; requirement {spec_text!r} was not checked")]
    # Nightlies (2.14.0a0+git...) count: a pre-release is the torch the target really runs.
    if spec.contains(version, prereleases=True):
        return []
    release = _minor_of(target.torch_version)
    admitted = all(_window_admits(p, target) for p in manifest.programs.values())
    return [_err("torch-version", None,
                 f"torch {target.torch_version} does not satisfy the bundle's requirement {spec_text!r}",
                 "the publisher declared the torch range the bundle runs on",
                 f"run it with torch {spec_text}" + (
                     f"; its programs' windows admit torch {release}, so a bundle rebuilt with "
                     f"--torch-requirement '>={release}' would run here" if admitted else ""))]


def _window_admits(prog: ProgramSpec, target: Target) -> bool:
    """Whether the program's recorded window admits the target's serde schema (False without one)."""
    window = prog.serialization.window
    return window is not None and window.schema[0] == target.serde_schema[0] and \
        window.schema[1] <= target.serde_schema[1]


def device_type_rule(manifest: Manifest, target: Target, device: Device | None) -> list[Finding]:
    """The device must be the target's, supported by the bundle, and new enough."""
    out = []
    device_type = device_type_of(device, target)
    if device_type != target.device_type:
        out.append(_err("device-type", None,
                        f"requested device {device} but the target describes a {target.device_type} machine",
                        fix=f"use --device {target.device_type} or a target file for a {device_type} machine"))
    allowed = manifest.requirements.device_types
    if allowed is not None and device_type not in allowed:
        out.append(_err("device-type", None,
                        f"the bundle supports device types {', '.join(allowed)}, not {device_type}",
                        "the publisher restricted where this bundle may run",
                        f"run it on {' or '.join(allowed)}"))
    need = manifest.requirements.min_compute_capability
    cc = target.compute_capability
    if need and device_type == "cuda" and cc is not None and tuple(cc) < tuple(need):
        out.append(_err("compute-capability", None,
                        f"the bundle needs compute capability >= {need[0]}.{need[1]}, the target is {cc[0]}.{cc[1]}",
                        fix=f"run it on a GPU with sm_{need[0]}{need[1]} or newer"))
    return out


def hardware_dtype_rule(manifest: Manifest, target: Target, device: Device | None) -> list[Finding]:
    """bf16 needs sm_80, fp8 sm_89 on CUDA; fp8 on CPU works but with few kernels (warning)."""
    out = []
    device_type = device_type_of(device, target)
    for name, prog in manifest.programs.items():
        for dtype in sorted(set(prog.dtypes) & HARDWARE_DTYPES):
            f = _dtype_finding(name, dtype, device_type, target)
            if f:
                out.append(f)
    return out


def _dtype_finding(name: str, dtype: str, device_type: str, target: Target) -> Finding | None:
    is_fp8 = dtype.startswith("float8")
    if device_type == "cuda" and target.rocm_version:
        if is_fp8:
            return _warn("hw-dtype", name, f"program {name!r} uses {dtype}; ROCm support depends on the GPU",
                         "fp8 needs MI300-class hardware", "check the GPU generation of the target")
        return None
    if device_type == "cuda":
        if dtype in _AMD_ONLY:
            return _err("hw-dtype", name, f"program {name!r} uses {dtype}, an AMD-only format, on a CUDA target",
                        fix="export with float8_e4m3fn/float8_e5m2 for NVIDIA GPUs")
        need = _MIN_CC.get(dtype)
        cc = target.compute_capability
        if need is None:
            return None
        if cc is None:
            return _warn("hw-dtype", name, f"program {name!r} uses {dtype}, which needs sm_{need[0]}{need[1]}; "
                         f"the target's compute capability is unknown", fix="add compute_capability to the target")
        if tuple(cc) < need:
            return _err("hw-dtype", name,
                        f"program {name!r} uses {dtype}, which needs compute capability >= {need[0]}.{need[1]}; "
                        f"the target is {cc[0]}.{cc[1]}",
                        f"{dtype} kernels exist only for sm_{need[0]}{need[1]} and newer",
                        "run it on a newer GPU, or export a float16/float32 variant")
        return None
    if is_fp8:
        return _warn("hw-dtype", name, f"program {name!r} uses {dtype} on {device_type}",
                     f"few {device_type} kernels support {dtype}; expect missing kernels or slow emulation",
                     "run it on a GPU with fp8 support (sm_89+)")
    return None


def custom_op_rule(manifest: Manifest, target: Target, device: Device | None) -> list[Finding]:
    """Each custom op registered on the target, with the same schema and a kernel for the device."""
    out = []
    device_type = device_type_of(device, target)
    keys = DEVICE_DISPATCH_KEYS.get(device_type, (device_type.upper(),))
    for name, prog in manifest.programs.items():
        for op in prog.required_ops:
            key = op.dispatcher_name
            info = target.custom_ops.get(key)
            if info is None:
                out.append(_err("custom-op-missing", name,
                                f"program {name!r} needs custom op {key}, which is not registered on the target",
                                "the graph calls it; without a registration the program cannot even deserialize",
                                f"register it first: --import MODULE or --load-library PATH.so that defines {op.name}"))
                continue
            want, have = _norm(op.schema), _norm(info.schema)
            if want and have and want != have:
                out.append(_err("custom-op-schema", name,
                                f"custom op {key} has schema '{info.schema}' on the target; the program was "
                                f"exported with '{op.schema}'",
                                "a different signature means different arguments or semantics",
                                "register the same version of the op library the model was exported with"))
            present = set(info.dispatch_keys)
            if not present & (set(keys) | COMPOSITE_KEYS):
                have_keys = ", ".join(info.dispatch_keys) or "none"
                out.append(_err("custom-op-kernel", name,
                                f"custom op {key} has no {keys[0]} kernel on the target (kernels: {have_keys})",
                                f"the op is registered but cannot run on {device_type} tensors",
                                f"build/register its {keys[0]} implementation, or run on a device it supports"))
    return out


def _norm(schema: str | None) -> str:
    return " ".join((schema or "").split())


def operator_rule(manifest: Manifest, target: Target, device: Device | None, *,
                  choices: Mapping[str, VariantChoice] | None = None) -> list[Finding]:
    """torch's own operators a portable program calls must be registered on the target with the
    schema they had at export: torch's reader resolves each node's operator by name and matches
    its arguments by name. Checked only when the target records ``op_schemas``."""
    if not target.op_schemas:
        return []
    out = []
    for name, prog in manifest.programs.items():
        chosen = _choices(manifest, target, device, choices)[name].variant
        if chosen is not None and chosen.kind != "exported_program":
            continue
        exporter = prog.serialization.torch_version
        missing, changed = [], []
        for op in prog.operators:
            key = op.dispatcher_name
            have = target.op_schemas.get(key)
            if have is None:
                missing.append(key)
            elif op.schema and schema_digest(op.schema) != have:
                changed.append(key)
        if missing:
            out.append(_err("operator-missing", name,
                            f"program {name!r} calls {_some(missing)}, which torch {target.torch_version} does "
                            f"not have (exported with torch {exporter})",
                            "torch's reader resolves every node's operator by name; a missing one fails the load",
                            f"run it with torch {_minor_of(exporter)} or newer, or re-export the model with torch "
                            f"{_minor_of(target.torch_version)}"))
        if changed:
            out.append(_err("operator-schema", name,
                            f"program {name!r} calls {_some(changed)}, whose schema differs on torch "
                            f"{target.torch_version} from torch {exporter}, which exported it",
                            "arguments are matched by name: a renamed one fails the load, a new one is dropped",
                            f"run it with torch {_minor_of(exporter)}, or re-export the model with torch "
                            f"{_minor_of(target.torch_version)}"))
    return out


def _some(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def torchbind_rule(manifest: Manifest, target: Target, device: Device | None) -> list[Finding]:
    """Every TorchBind class the program holds must be registered on the target."""
    have = {c.removeprefix("__torch__.") for c in target.torchbind_classes}
    out = []
    for name, prog in manifest.programs.items():
        for cls in prog.torchbind_classes:
            if cls.removeprefix("__torch__.") not in have:
                out.append(_err("torchbind", name,
                                f"program {name!r} holds a TorchBind object of class {cls}, which is not "
                                f"registered on the target",
                                "its methods and (de)serialization come from a compiled library",
                                "load the library that defines it: --load-library PATH.so"))
    return out


def aoti_target_rule(manifest: Manifest, target: Target, device: Device | None, *,
                     choices: Mapping[str, VariantChoice] | None = None) -> list[Finding]:
    """A program with only AOTInductor variants needs one built exactly for the target, and
    native code allowed (``native-code`` error otherwise, which refuses with exit 5)."""
    out = []
    for name, choice in _choices(manifest, target, device, choices).items():
        chosen, reason, native = choice.variant, choice.reason, choice.passed_over
        if chosen is None:
            if native is not None:
                out.append(_err(
                    "native-code", name,
                    f"program {name!r} has only AOTInductor variants (native code) and {native.id!r} is not "
                    f"allowed: the bundle is not signed by a key trusted here",
                    "a compiled shared library runs with this process's rights and cannot be vetted like a graph",
                    NATIVE_FIX))
                continue
            out.append(_err("aoti-target", name,
                            f"program {name!r} has only AOTInductor variants and none matches the target "
                            f"({reason.split(': ', 1)[-1]})",
                            "compiled code runs only on the device, GPU generation and platform it was built for",
                            "add a variant compiled on the target, or bundle the portable program with it"))
    return out


def baked_device_rule(manifest: Manifest, target: Target, device: Device | None, *,
                      choices: Mapping[str, VariantChoice] | None = None) -> list[Finding]:
    """Devices hard-coded at export: moved with the portable program (warning), else an error."""
    out = []
    choices = _choices(manifest, target, device, choices)
    device = device or Device(target.device_type)
    for name, prog in manifest.programs.items():
        chosen = choices[name].variant
        # one finding per device and source line (each op: inspect --json, programs.*.baked_devices)
        for g in baked_device_groups([b for b in prog.baked_devices if not _same(b.device, device)]):
            what = f"program {name!r}: {g.head}"
            code = f": {g.quote}" if g.quote else ""
            if chosen is not None and chosen.kind == "exported_program":
                out.append(_warn("baked-device", name, f"{what}, will be moved to {device} at load{code}",
                                 "export records device constants; the loader rewrites them with move_to_device_pass",
                                 "nothing to do; to avoid it, create tensors with device=x.device before export"))
            elif chosen is not None:
                out.append(_warn("baked-device", name, f"{what}, which the AOTInductor variant {chosen.id} may still use{code}",
                                 "compiled code keeps the devices of the graph it was compiled from",
                                 "compile the AOTInductor variant from a program moved to the target device"))
            else:
                out.append(_err("baked-device", name, f"{what}, which cannot be moved: the program has no portable variant{code}",
                                "only a portable ExportedProgram can be moved to another device",
                                "bundle the portable program beside its AOTInductor variants"))
    return out


def pytree_class_rule(manifest: Manifest, target: Target, device: Device | None) -> list[Finding]:
    """Library pytree classes in a program's treespecs (transformers ``ModelOutput`` ...).

    torch resolves them by serialized name while deserializing. One whose context lists its
    fields is stood in for by the loader when this process has not registered it (an ``info``
    finding); one it cannot stand in for must be registered here, or the load would fail: an
    error naming the module to import. Nothing is imported because a manifest names it."""
    from .torchrt import module_to_import, pytree_registered

    out = []
    for name, prog in manifest.programs.items():
        for c in pytree_classes_of(prog):  # pt2.treespec's view of the treespecs
            cls = c["type"]  # dicts of registry.pt2.treespec, not manifest entries
            if pytree_registered(cls):
                continue
            module = module_to_import(cls)
            if c.get("fields") is None:
                out.append(_err("pytree-class", name,
                                f"program {name!r} uses the pytree class {cls}, which is not registered in this "
                                f"process and cannot be stood in for (its treespec does not list field names)",
                                "torch resolves pytree classes by name while deserializing the program",
                                f"import the module that registers it: --import {module}"))
            else:
                fields = ", ".join(c["fields"])
                out.append(Finding(
                    "info", "pytree-stand-in", name,
                    f"program {name!r} uses {cls} ({module} is not imported here): it is returned as a "
                    f"mapping with the same fields ({fields}), also readable as attributes",
                    "the registry stands in for library output classes so the program runs without the library",
                    f"for the real class, import it first: --import {module}"))
    return out


#: Every rule, in report order. Each: (manifest, target, device) -> list[Finding].
RULES: tuple[Callable[[Manifest, Target, str | None], list[Finding]], ...] = (
    serde_schema_rule, torch_version_rule, device_type_rule, hardware_dtype_rule, custom_op_rule,
    operator_rule, torchbind_rule, aoti_target_rule, baked_device_rule, pytree_class_rule)


#: Rules about this process rather than the target (what it has imported): not for a server
#: answering for a described machine
PROCESS_RULES = (pytree_class_rule,)

#: Rules whose verdict depends on the chosen variant: ``check`` hands them its ``choices``.
_VARIANT_RULES = (serde_schema_rule, operator_rule, aoti_target_rule, baked_device_rule)


def _same(recorded: str, device: Device) -> bool:
    """A device read from the manifest is ``device`` (one it cannot parse is not)."""
    d = Device.try_parse(recorded)
    return d is not None and d.same_as(device)


def check(manifest: Manifest, target: Target, device: DeviceLike | None = None, *,
          allow_native: bool = True, this_process: bool = True) -> CompatReport:
    """Run every rule and choose a variant per program. ``device`` (a ``Device`` or its text)
    defaults to the target's type.

    ``allow_native=False``: AOTInductor variants are never chosen; an ``info`` finding
    ``native-code`` says which one was passed over and how to allow it, and a program with only
    such variants gets a ``native-code`` error. ``this_process=False`` (a server answering for
    a described machine) leaves out the rules about what this process has registered
    (``PROCESS_RULES``).
    """
    device = Device.parse_optional(device)
    variants = choose_variants(manifest, target, device, allow_native=allow_native)
    rules = RULES if this_process else tuple(r for r in RULES if r not in PROCESS_RULES)
    findings = [f for rule in rules for f in (rule(manifest, target, device, choices=variants)
                                              if rule in _VARIANT_RULES else rule(manifest, target, device))]
    for name, choice in variants.items():
        native = choice.passed_over
        if choice.variant is not None and native is not None:
            findings.append(Finding(
                "info", "native-code", name,
                f"program {name!r}: AOTInductor variant {native.id!r} matches the target but was not "
                f"chosen (native code, and the bundle is not signed by a key trusted here); using the "
                f"portable program",
                "a compiled shared library runs with this process's rights and cannot be vetted like a graph",
                NATIVE_FIX))
    return CompatReport(compatible=not any(f.severity == "error" for f in findings),
                        findings=tuple(findings), variants=variants)


# ------------------------------------------------------------------------------ release matrix

@dataclass(frozen=True)
class ReleaseVerdict:
    """Whether a supported torch release (``2.11``) can read every program of a bundle, from
    the manifest alone (windows, requirement, AOTInductor variants' torch), and why not."""

    release: str
    ok: bool
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"release": self.release, "ok": self.ok, "reason": self.reason}


def release_matrix(manifest: Manifest) -> list[ReleaseVerdict]:
    """One verdict per supported torch release (``registry.pt2.window.RELEASES``), oldest first:
    what the server's version page shows. Operators and devices depend on the machine, not
    just its torch: ``pt2reg verify --target box.json REF`` checks those too."""
    from ..pt2.window import RELEASES

    spec_text = manifest.requirements.torch
    try:
        spec = SpecifierSet(spec_text) if spec_text else None
    except InvalidSpecifier:
        spec = None
    out = []
    for release, (major, minor) in RELEASES.items():
        why = []
        if spec is not None and not spec.contains(Version(f"{release}.0"), prereleases=True):
            why.append(f"the bundle requires torch {spec_text}")
        for name, prog in manifest.programs.items():
            if prog.portable is not None:
                window, ser = prog.serialization.window, prog.serialization
                need = window.schema if window is not None else ser.schema_version
                if need[0] != major or need[1] > minor:
                    since = f"torch >= {window.torch}" if window is not None else f"serde schema {need[0]}.{need[1]}"
                    why.append(f"program {name!r} needs {since}")
            elif not any(v.target is None or not v.target.torch_version or _minor_of(v.target.torch_version) == release
                         for v in prog.variants):
                why.append(f"program {name!r} has only AOTInductor variants, compiled by another torch")
        out.append(ReleaseVerdict(release, not why, "; ".join(why) or "reads every program"))
    return out
