"""Verify, then trust: load a bundle's programs onto a device and call them by name::

    bundle = load_bundle(materialize_file("model.pt2b", cache_dir), device="cpu")
    logits = bundle["decoder"](hidden, targets)
    [r.ok for r in bundle.run_samples()]

Order of operations: compatibility check against the target (``registry.runtime.compat``; nothing is
deserialized when it fails) -> pickle scan of the chosen members (refused unless
``trust_pickle``) -> first load on this machine of a program no trusted key signed: the same
deserialization in a limited subprocess (``registry.runtime.sandbox``) -> load the chosen variant
(portable program moved to the device with ``move_to_device_pass``, or an AOTInductor package,
chosen only when a trusted key signed the bundle or ``trust_native``) -> every call's inputs
checked against the signature (``registry.runtime.inputs``) before the graph runs. The trust
policy (``registry.client.trust``) is enforced by ``load`` before any of this.

A cold ``load`` of a ref gets a ``pending`` bundle (``Registry.materialize(defer_weights=True)``):
everything but its raw weight records is verified, and the weights are still being fetched.
Vetting and torch's deserialization (which maps the weights and reads none) run meanwhile; a
read of an unverified record raises ``torchrt.WeightsNotVerified`` first, and the load waits.
The bundle is settled (every chunk verified, the file in the cache) before the sandbox's child
runs, before an AOTInductor variant or copied weights are loaded, and before any module is
moved to its device or handed back.
"""
from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..atomic import USER_FILE, atomic_write
from ..client.sources import MaterializedBundle
from ..errors import IncompatibleError, InputValidationError, NotFoundError, UnsafeArchiveError, UsageError, brief
from ..format.manifest import Manifest, ProgramSpec, Variant
from ..pt2.verdicts import pickled_of, read_verdict, verdicts_dir, write_verdict
from .compat import CompatReport, Finding, check, pytree_classes_of
from .device import Device, DeviceLike
from .inputs import call_arguments, check_constant, check_inputs, fill_baked_call, flat_count, without_constants
from .target import Target

__all__ = ["LoadedBundle", "LoadedProgram", "SampleResult", "load_bundle", "load", "verify_bundle", "needed_operators",
           "needs_cpu_isa", "pickle_findings", "native_code_findings", "native_allowed", "save_outputs",
           "precheck_inputs", "place_program", "Status"]

#: where the loader says what it is doing while it takes long (the first-load sandbox): a
#: function taking one line; ``pt2reg`` writes it on stderr
Status = Callable[[str], None]


@dataclass(frozen=True)
class SampleResult:
    """One golden sample run on the target: per output max abs/rel error and tolerance verdict."""

    name: str
    program: str
    variant: str
    ok: bool
    outputs: tuple[Mapping[str, Any], ...]
    rtol: float
    atol: float
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "program": self.program, "variant": self.variant, "ok": self.ok,
                "rtol": self.rtol, "atol": self.atol, "error": self.error,
                "outputs": [dict(o) for o in self.outputs]}


#: messages of torch's checks on a program's inputs (run inside the graph module)
_TORCH_INPUT_CHECK = re.compile(r"\s*(Guard failed|Expected input|Runtime assertion failed|"
                                r"Dynamic shape constraint violation)")


class LoadedProgram:
    """A program ready to run on one device. Calls are validated against its signature first."""

    def __init__(self, spec: ProgramSpec, variant: Variant, device: DeviceLike, module: Any) -> None:
        self.spec = spec
        self.variant = variant
        self.device = Device.parse(device)
        self._module = module

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"<LoadedProgram {self.name} variant={self.variant.id} device={self.device}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .torchrt import bind_call, torch

        if self.spec.constant_inputs:  # baked-in arguments: the exported value or left out
            args, kwargs = fill_baked_call(self.spec, args, kwargs)
        flat, args, kwargs = bind_call(args, kwargs, self.spec.in_spec, list(self.spec.forward_arg_names))
        constants = self.spec.constant_inputs
        if constants:
            for c in constants:
                check_constant(c, flat[c.leaf] if c.leaf < len(flat) else None)
            flat = without_constants(flat, constants)
        check_inputs(self.spec.inputs, flat, device=self.device)
        guards = getattr(self._module, "_registry_guards", None)
        if guards:  # export guards, evaluated by registry.pt2.guards (torch never exec()s them)
            from ..pt2.guards import GuardFailure, check_guards

            names = list(self.spec.forward_arg_names or [i.name for i in self.spec.inputs])
            env: dict[str, Any] = dict(zip(names, args))
            env.update(kwargs)
            env.setdefault("flat_args", list(flat))
            try:
                check_guards(guards, env)
            except GuardFailure as exc:
                raise InputValidationError(f"program {self.name!r} refuses these inputs: {exc} "
                                           f"(it was exported for inputs that satisfy this)") from None
        with torch().no_grad():
            try:
                return self._module(*args, **kwargs)
            except (AssertionError, RuntimeError, ValueError) as exc:
                # torch's own input checks (export guards, derived-dim forms) come last
                if _TORCH_INPUT_CHECK.match(str(exc)):
                    raise InputValidationError(f"program {self.name!r} refuses these inputs: {brief(exc)} "
                                               f"(it was exported for inputs that satisfy this)") from exc
                raise

    def run(self, value: Any) -> list[Any]:
        """Run on inputs as read from a file or sample (flat tuple, or dict by input name),
        moved to the device first; returns the flat outputs."""
        from .torchrt import flatten_outputs, to_device

        count = flat_count(self.spec, value)  # nested tuples (a baked-in (3, 4)) opened
        full = len(self.spec.inputs) + len(self.spec.constant_inputs)
        if count is not None and count not in (len(self.spec.inputs), full):
            names = ", ".join(i.name for i in self.spec.inputs)
            raise InputValidationError(f"program {self.name!r} takes {len(self.spec.inputs)} input(s) "
                                       f"({names}), got {count}")
        args, kwargs = call_arguments(self.spec, value)
        args, kwargs = to_device((args, kwargs), self.device)
        return flatten_outputs(self(*args, **kwargs))


class LoadedBundle:
    """Programs of one bundle loaded for one device, by name: ``bundle["decoder"](x)``."""

    def __init__(self, src: MaterializedBundle, report: CompatReport, target: Target, device: DeviceLike,
                 programs: Mapping[str, LoadedProgram]) -> None:
        self.source = src
        self.report = report
        self.target = target
        self.device = Device.parse(device)
        self._programs = dict(programs)

    @property
    def manifest(self) -> Manifest:
        return self.source.manifest

    @property
    def digest(self) -> str:
        return self.source.digest

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the bundle's only loaded program (``load(ref)(x)``); with several, name one:
        ``bundle["decoder"](x)``."""
        if len(self._programs) != 1:
            raise UsageError(f"the bundle has programs {', '.join(self._programs)}; call one by name: "
                             f"bundle[{next(iter(self._programs))!r}](...)")
        return next(iter(self._programs.values()))(*args, **kwargs)

    def __getitem__(self, name: str) -> LoadedProgram:
        try:
            return self._programs[name]
        except KeyError:
            raise NotFoundError(f"bundle has no loaded program {name!r}; programs: "
                                f"{', '.join(self._programs)}", what="program", name=name) from None

    def __contains__(self, name: object) -> bool:
        return name in self._programs

    def __iter__(self) -> Iterator[str]:
        return iter(self._programs)

    def __len__(self) -> int:
        return len(self._programs)

    def run_samples(self) -> list[SampleResult]:
        """Run every golden sample of the loaded programs on the device and compare outputs."""
        from .samples import compare_outputs, read_sample, sample_tolerance

        results = []
        for s in self.manifest.samples:
            if s.program not in self._programs:
                continue
            program = self._programs[s.program]
            inputs, expected = read_sample(self.source.member_file(s.member), list(s.inputs), list(s.outputs),
                                           label=f"{self.source.label or self.digest}: {s.member}")
            try:
                actual = program.run(tuple(inputs))
            except InputValidationError as exc:
                results.append(SampleResult(s.name, s.program, program.variant.id, False, (), s.rtol, s.atol,
                                            f"sample inputs rejected: {exc.one_line()}"))
                continue
            except Exception as exc:  # a self-test reports the failure instead of stopping
                first = (str(exc).strip().splitlines() or [""])[0]
                results.append(SampleResult(s.name, s.program, program.variant.id, False, (), s.rtol, s.atol,
                                            f"{type(exc).__name__}: {first}"))
                continue
            rows = compare_outputs(actual, expected, s.rtol, s.atol,
                                   tolerance=lambda dtype, s=s: sample_tolerance(s, self.device, dtype))
            results.append(SampleResult(s.name, s.program, program.variant.id, all(r["ok"] for r in rows),
                                        tuple(rows), s.rtol, s.atol))
        return results


def needs_cpu_isa(manifest: Manifest) -> bool:
    """Whether choosing a variant depends on the CPU ISA (an AOTInductor CPU variant exists)."""
    return any(v.kind == "aoti" and (v.target is None or (v.target.device_key or "cpu") == "cpu")
               for p in manifest.programs.values() for v in p.variants)


def needed_operators(manifest: Manifest) -> list[str]:
    """Dispatcher names of torch's own operators the bundle's programs call (what a probe looks
    up for the operator rule)."""
    return sorted({op.dispatcher_name for spec in manifest.programs.values() for op in spec.operators})


def _resolve_target(src: MaterializedBundle, device: Device | None, target: Target | None) -> Target:
    if target is not None:
        return target
    from .probe import probe

    needed = {op.dispatcher_name for spec in src.manifest.programs.values() for op in spec.required_ops}
    return probe(device, cpu_isa=needs_cpu_isa(src.manifest), ops=sorted(needed),
                 operators=needed_operators(src.manifest))


def _load_device(device: DeviceLike | None, target: Target | None) -> Device:
    """The device a load runs on: the one named; else the target's device type when a target
    is given; else the default policy (``probe.default_device``: cuda:0 if available, else cpu)."""
    if device is not None:
        return Device.parse(device)
    if target is not None:
        return Device(target.device_type)
    from .probe import default_device

    return default_device()


@dataclass(frozen=True)
class _Vetted:
    """A chosen variant's member, vetted as torch will read it, and what in it is pickled."""

    program: str
    member: str
    tensors: tuple[str, ...]   # pickled tensors (tensor subclasses): loadable with trust_pickle
    objects: tuple[str, ...]   # pickled objects (TorchBind, opaque, sample inputs): never loaded


def _vet(src: MaterializedBundle, report: CompatReport, verdicts: Path | None = None) -> list[_Vetted]:
    """Vet each chosen variant's member the way torch will read it, whatever the flags: the
    canonical zip layout, the exact member allowlist, canonical JSON, the graph checks and the
    payload sizes (``open_pt2(canonical=True)``). Raises UnsafeArchiveError (exit 5) naming the
    program's member; returns what each would unpickle, as the reader found it (each chosen
    member is read once per check or load, the other variants not at all).

    With ``verdicts`` (a directory of the client cache, ``registry.pt2.verdicts``), a member
    that passed is remembered by its digest, kind and the code that vetted it: its bytes come
    from the verified cache, so a later load of the same content by the same code (or the first
    load on the machine that bundled or pushed it) skips the graph checks (their cost grows
    with the graph: ~0.1 ms per tensor, a second for a program of 10,000 tensors)."""
    from ..pt2.reader import open_pt2

    out = []
    for name, choice in report.variants.items():
        variant = choice.variant
        if variant is None:
            continue
        member = src.manifest.member(variant.member)
        digest = member.digest if member else None
        known = read_verdict(verdicts, digest, variant.kind)
        if known is not None:
            out.append(_Vetted(name, variant.member, *known))
            continue
        where = f"program {name!r} ({variant.member})"
        archive = open_pt2(src.member_file(variant.member), where=where, canonical=True, kind=variant.kind)
        tensors, objects = pickled_of(archive)
        out.append(_Vetted(name, variant.member, tensors, objects))
        write_verdict(verdicts, digest, variant.kind, tensors, objects)
    return out


def _pickle_message(name: str, member: str, entries: Sequence[str], what: str = "pickled data") -> str:
    more = f" (+{len(entries) - 3} more)" if len(entries) > 3 else ""
    return f"program {name!r} ({member}) holds {what}: {', '.join(entries[:3])}{more}"


_OBJECTS_WHY = "unpickling runs code chosen by whoever made the file"
_OBJECTS_FIX = ("pickled objects are never loaded, whatever the flags; export the program without "
                "TorchBind/opaque objects")
_TENSORS_FIX = "load it only if you trust the publisher (--trust-pickle)"


def pickle_findings(src: MaterializedBundle, report: CompatReport, *, trust_pickle: bool = False
                    ) -> list[Finding]:
    """Members of the chosen variants that torch would unpickle when loading them. Pickled
    objects are always errors; pickled tensors are errors (the load would be refused, exit 5)
    unless the user trusts the bundle (``trust_pickle`` permits pickled tensors, nothing else)."""
    out = []
    for v in _vet(src, report):
        if v.objects:
            out.append(Finding("error", "pickle", v.program,
                               _pickle_message(v.program, v.member, v.objects, "pickled objects"),
                               _OBJECTS_WHY, _OBJECTS_FIX))
        if v.tensors:
            out.append(Finding("warning" if trust_pickle else "error", "pickle", v.program,
                               _pickle_message(v.program, v.member, v.tensors, "pickled tensors"),
                               _OBJECTS_WHY, _TENSORS_FIX))
    return out


def native_code_findings(src: MaterializedBundle, report: CompatReport) -> list[Finding]:
    """A finding for each chosen AOTInductor variant: loading it maps a compiled shared library
    into this process, which no check of ours can vet the way a graph is vetted. ``info`` when a
    trusted key signed the bundle, a ``warning`` when only ``--trust-native`` allowed it."""
    out = []
    signers = tuple(getattr(src, "trusted_signers", ()) or ())
    for name, choice in report.variants.items():
        variant = choice.variant
        if variant is not None and variant.kind == "aoti":
            allowed = (f"allowed: signed by trusted key {signers[0][:19]}..." if signers
                       else "allowed by --trust-native")
            out.append(Finding("info" if signers else "warning", "native-code", name,
                               f"program {name!r} would run as AOTInductor variant {variant.id!r}: a compiled "
                               f"shared library loaded into this process ({allowed})",
                               "native code runs with this process's rights; unlike a graph it cannot "
                               "be checked before it runs",
                               "" if signers else "run it only from a publisher you trust: require their "
                               "signature with --require-signature KEY or a trust policy"))
    return out


def native_allowed(src: MaterializedBundle, trust_native: bool = False) -> bool:
    """AOTInductor variants may be chosen: ``--trust-native``, or a trusted key signed the bundle."""
    return bool(trust_native or getattr(src, "trusted_signers", ()))


def _refuse_native(src: MaterializedBundle, findings: Sequence[Finding], wanted: Sequence[str] | None = None) -> None:
    """A program that has only AOTInductor variants, native code not allowed: exit 5, one line."""
    f = next((f for f in findings if f.severity == "error" and f.code == "native-code"
              and (wanted is None or f.program in wanted)), None)
    if f is not None:
        raise UnsafeArchiveError(f"{src.label or src.digest}: {f.message}", hint=f.fix)


def _default_sandbox() -> Any:
    from ..config import Settings
    from .sandbox import SandboxConfig

    return SandboxConfig.from_env(Settings.resolve().cache_dir)


def verify_bundle(src: MaterializedBundle, *, device: DeviceLike | None = None, target: Target | None = None,
                  trust_pickle: bool = False, trust_native: bool = False, read_members: bool = True) -> CompatReport:
    """Every check but the load: compatibility with the target and the pickle scan, all at once.

    AOTInductor variants are considered only when ``trust_native`` or a trusted key signed the
    bundle (``src.trusted_signers``); otherwise an ``info`` ``native-code`` finding says which
    variant was passed over (an ``error`` when a program has nothing else). For example::

        report = verify_bundle(src, target=Target.load("box.json"))
        report.compatible, [f.message for f in report.findings]

    ``device`` (a ``Device`` or its text) defaults to the target's device type, and without a
    target to the default policy (cuda:0 if available, else cpu), as ``load_bundle`` does.
    ``read_members=False`` decides from the manifest alone (``Registry.describe``: nothing
    fetched): the members' contents (pickles, the graph checks) are left to the load, which an
    ``info`` finding ``metadata-only`` says.
    """
    dev = Device.parse_optional(device)
    target = _resolve_target(src, dev, target)
    report = check(src.manifest, target, dev, allow_native=native_allowed(src, trust_native))
    scanned = pickle_findings(src, report, trust_pickle=trust_pickle) if read_members else [Finding(
        "info", "metadata-only", None,
        "decided from the registry's metadata alone: no member was fetched, so their contents (pickled "
        "objects, the graph checks) are checked when the bundle is pulled or loaded",
        "the manifest records the window, operators, devices and variants each program needs",
        "to check the contents too, verify without --target on the machine, or pull it first")]
    extra = scanned + native_code_findings(src, report)
    compatible = report.compatible and not any(f.severity == "error" for f in extra)
    return CompatReport(compatible, report.findings + tuple(extra), report.variants)


def load_bundle(src: MaterializedBundle, *, device: DeviceLike | None = None, target: Target | None = None,
                trust_pickle: bool = False, programs: Sequence[str] | None = None,
                trust_native: bool = False, sandbox: Any = None, map_weights: bool = True,
                status: Status | None = None) -> LoadedBundle:
    """Check the bundle against ``target`` (default: ``probe(device)``), then load it on ``device``
    (a ``Device`` or its text; default: the target's device type, else cuda:0 if this machine
    has a GPU, else cpu).

    Every weight is deserialized onto the CPU (mapped, not read) whatever device the program
    was exported on, and the program is then moved to ``device`` with ``move_to_device_pass``:
    a program exported on a GPU loads and runs on a CPU-only machine, and deserializing never
    needs a GPU.

    Raises IncompatibleError (exit 4, ``.findings``) before any deserialization when an error
    rule fires, and UnsafeArchiveError (exit 5) for pickled members unless ``trust_pickle``.
    ``programs`` limits loading to some program names. AOTInductor variants (native code) are
    chosen only with ``trust_native`` or when a trusted key signed the bundle
    (``src.trusted_signers``); a program with nothing else is refused (exit 5). Each program
    not signed by a trusted key is first deserialized in a limited subprocess, once per machine
    (``sandbox``: a ``registry.runtime.sandbox.SandboxConfig``, default from ``PT2REG_SANDBOX*``).
    ``map_weights`` (default): a portable program's weights are views of a private,
    copy-on-write map of its verified cache file, not copies (README "Weights are mapped, not
    copied"); False copies them into process memory as ``torch.export.load`` does (a process
    that must not fault pages in from disk later, or whose cache may be truncated under it).
    ``status``: told one line when the load will take long (the first-load sandbox check).
    """
    wanted = list(programs) if programs is not None else list(src.manifest.programs)
    unknown = [p for p in wanted if p not in src.manifest.programs]
    if unknown:
        raise NotFoundError(f"bundle has no program {unknown[0]!r}; programs: "
                            f"{', '.join(src.manifest.programs)}", what="program", name=unknown[0])
    device = _load_device(device, target)
    target = _resolve_target(src, device, target)
    allow_native = native_allowed(src, trust_native)
    report = check(src.manifest, target, device, allow_native=allow_native)
    _refuse_native(src, report.findings, wanted)
    # Problems of programs not being loaded do not block the ones that are.
    errors = [f for f in report.errors if f.program is None or f.program in wanted]
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise IncompatibleError(f"{src.label or src.digest} cannot run on {device}: {errors[0].message}{more}",
                                findings=list(report.findings), hint=errors[0].fix or None)
    # whatever the flags: torch reads only vetted bytes. A forged member makes the whole bundle
    # suspect (every chosen variant is vetted); a pickled one blocks only its own program.
    config = sandbox if sandbox is not None else _default_sandbox()
    for v in _vet(src, report, verdicts_dir(config.vetted_dir.parent)):  # the client cache's
        if v.program not in wanted:
            continue
        if v.objects:
            also = f" and pickled tensors: {', '.join(v.tensors[:3])}" if v.tensors else ""
            raise UnsafeArchiveError(f"{_pickle_message(v.program, v.member, v.objects, 'pickled objects')}"
                                     f"{also}; refusing to load it", member=v.member, hint=_OBJECTS_FIX)
        if v.tensors and not trust_pickle:
            raise UnsafeArchiveError(f"{_pickle_message(v.program, v.member, v.tensors, 'pickled tensors')}; "
                                     f"refusing to load it", member=v.member, hint="pass --trust-pickle "
                                     "(trust_pickle=True) only if you trust the publisher")
    chosen = []
    for name in wanted:  # the variants the report chose (once, for the rules and this load)
        choice = report.variants[name]
        if choice.variant is None:  # the aoti-target rule already failed the report; kept for safety
            raise IncompatibleError(f"program {name!r}: {choice.reason}", findings=list(report.findings))
        chosen.append((src.manifest.programs[name], choice.variant))
    # right before torch reads them here: programs no trusted key signed are deserialized once
    # per machine in one limited subprocess first (registry.runtime.sandbox; exit 5 if it crashes or runs out)
    from .sandbox import vet_programs

    if src.pending is not None and (not map_weights or any(v.kind == "aoti" for _, v in chosen) or
                                    sandboxed_first(src, config)):
        src = src.settled()  # torch (or the sandbox's child) would read the weights: all verified first
    vet_programs(src, chosen, device, config, status=status)
    programs = []
    for spec, variant in chosen:
        src, program = _deserialize(src, spec, variant, device, map_weights)
        programs.append((spec, variant, program))
    src = src.settled()  # every chunk verified before anything reads a weight
    loaded = {spec.name: LoadedProgram(spec, variant, device, _on_device(program, spec, variant, device))
              for spec, variant, program in programs}
    return LoadedBundle(src, report, target, device, loaded)


def sandboxed_first(src: MaterializedBundle, config: Any) -> bool:
    """Whether the first-load sandbox's child (``config``: a ``SandboxConfig``) may deserialize
    ``src``'s programs before this process does (none of its signers is trusted): its member
    files are then settled, complete, before anything is deserialized, so a cold load should
    copy them, not use them in place (``Registry.materialize(in_place=...)``)."""
    return bool(config.enabled and not src.trusted_signers)


def _deserialize(src: MaterializedBundle, spec: ProgramSpec, variant: Variant, device: Device,
                 map_weights: bool) -> tuple[MaterializedBundle, Any]:
    """The variant's program as torch loads it (an ExportedProgram, or the AOTInductor
    runner), and ``src`` (settled if torch needed a weight not verified yet: it is then loaded
    again from the complete file)."""
    from . import torchrt

    label = f"{src.label or src.digest} ({variant.member})"  # the user's file or ref, not the cache blob
    torchrt.stand_in_pytree_classes(pytree_classes_of(spec))  # before torch reads the treespecs
    if variant.kind == "aoti":
        return src, torchrt.load_aoti(src.member_file(variant.member), variant.archive_name, device,
                                      label=label, program=spec.name)
    try:
        return src, torchrt.load_exported_program(  # a cache file: never written in place
            src.member_file(variant.member), variant.archive_name, label=label, program=spec.name,
            map_weights=map_weights, unverified=src.unverified(variant.member),
            elsewhere=src.in_place(variant.member))
    except torchrt.WeightsNotVerified:
        src = src.settled()  # and a member verified in place is copied into the cache (member_file)
    return src, torchrt.load_exported_program(src.member_file(variant.member), variant.archive_name,
                                              label=label, program=spec.name, map_weights=map_weights)


def _on_device(program: Any, spec: ProgramSpec, variant: Variant, device: Device) -> Any:
    """The callable module of a deserialized program on ``device``."""
    if variant.kind == "aoti":
        return program
    return place_program(program, spec, device)


def recorded_devices(spec: ProgramSpec) -> set[str]:
    """Every device the program's files name: baked into ops, its weights', its inputs' and
    outputs' (as written: parsed by whoever compares them)."""
    return ({b.device for b in spec.baked_devices}
            | {t.device for t in (*spec.inputs, *spec.outputs) if t.device})


def place_program(ep: Any, spec: ProgramSpec, device: DeviceLike) -> Any:
    """The callable module of a deserialized portable program (its weights on the CPU, as
    ``torchrt.load_exported_program`` places them) running on ``device``: moved there with
    ``move_to_device_pass`` (weights, baked device arguments, the graph's tensor metadata)
    unless the device is the CPU and every device the program records is the CPU too, where
    the pass would only cost time; its export guards restored (``torchrt.restore_guards``)."""
    from . import torchrt

    dev = Device.parse(device)
    recorded = [Device.try_parse(d) for d in recorded_devices(spec)]
    if not dev.is_cpu or any(d is None or not d.same_as(dev) for d in recorded):
        ep = torchrt.move_to_device(ep, dev)
    return torchrt.restore_guards(ep).module()


class _ChecksPassed(Exception):
    """Raised by ``precheck_inputs``'s stand-in module where the graph would run."""


def precheck_inputs(spec: ProgramSpec, value: Any) -> None:
    """Refuse inputs before the program is loaded (loading a big program takes seconds).

    Runs exactly the checks ``LoadedProgram.run`` makes before its graph runs (input count and
    structure, baked-in arguments, dtypes, shapes and Dim ranges) against the manifest alone,
    with a stand-in where the module would be. Raises what the call would raise
    (InputValidationError, exit 4). Left to the call: the device the tensors are on and the
    export guards, which are read from the program itself.

    >>> precheck_inputs(src.manifest.programs["encoder"], (tokens, mask))   # doctest: +SKIP
    """
    def stand_in(*args: Any, **kwargs: Any) -> Any:
        raise _ChecksPassed

    try:
        LoadedProgram(spec, spec.variants[0], "cpu", stand_in).run(value)
    except _ChecksPassed:
        pass


def load(source: str | os.PathLike | MaterializedBundle, *, device: DeviceLike | None = None,
         target: Target | None = None, trust_pickle: bool = False, imports: Sequence[str] = (),
         libraries: Sequence[str] = (), cache_dir: str | os.PathLike | None = None,
         programs: Sequence[str] | None = None, require_signature: Sequence[str] = (),
         trust_native: bool = False, map_weights: bool = True, registry: Any = None,
         status: Status | None = None) -> LoadedBundle:
    """``registry.load``: a bundle file, a registry ref or a materialized bundle, loaded on ``device``.

    ``device`` (``"cuda:1"`` or a ``Device``) defaults as ``pt2reg run`` does: cuda:0 when this
    machine has a GPU, else cpu (``probe.default_device``). The trust policy
    (``HOME/trust.toml`` or ``PT2REG_TRUST``) and ``require_signature`` are enforced before
    anything is deserialized (SignatureError, exit 5). AOTInductor variants are used only when
    a trusted key signed the bundle or ``trust_native=True``. ``map_weights`` and ``status``:
    see ``load_bundle``. ``registry``: an open ``Registry`` to resolve refs with (default: one
    from the environment, closed when the load is done). ``pt2reg run`` is this function. For
    example::

        bundle = load("team/translator@prod", device="cuda:0", imports=["mylib.ops"])
        bundle["decoder"](hidden, targets)
        load("model.pt2b")(x)                # a one-program bundle is callable itself
    """
    from ..client import Registry
    from .sandbox import SandboxConfig
    from .torchrt import import_modules, load_libraries

    dev = Device.parse_optional(device)  # a bad device is refused before anything is fetched
    load_libraries(list(libraries))
    import_modules(list(imports))
    # the trust policy and require_signature before anything is deserialized. A ref not cached
    # comes back with its raw weights still being fetched (``src.pending``) while torch
    # deserializes the rest: the registry stays open until load_bundle has settled it
    with contextlib.ExitStack() as stack:
        reg = registry if registry is not None else stack.enter_context(Registry(cache_dir=cache_dir))
        sandbox = SandboxConfig.from_env(reg.cache_dir, imports=imports, libraries=libraries)
        src = open_source_for_load(source, reg, sandbox, require_signature=require_signature,
                                   defer_weights=map_weights)
        try:
            return load_bundle(src, device=dev, target=target, trust_pickle=trust_pickle, programs=programs,
                               trust_native=trust_native, sandbox=sandbox, map_weights=map_weights, status=status)
        finally:
            if src.pending is not None:
                src.pending.abort()  # a load that failed first: stop the fetch, leave no file


def open_source_for_load(source: str | os.PathLike | MaterializedBundle, registry: Any, sandbox: Any, *,
                         require_signature: Sequence[str] = (), defer_weights: bool = True) -> MaterializedBundle:
    """``open_source`` as a load wants it: the trust policy enforced, a cold ref's weights
    (``defer_weights``) fetched while the load runs, and used in place in a local store unless
    the first-load sandbox (``sandbox``) will read them first. The caller aborts ``pending``."""
    from ..client.sources import open_source

    return open_source(source, registry=registry, require_signature=require_signature,
                       defer_weights=defer_weights, in_place=lambda s: not sandboxed_first(s, sandbox))


def save_outputs(path: str | os.PathLike, outputs: Sequence[Any]) -> Path:
    """``torch.save`` a tuple of tensors (moved to CPU) atomically: temp file, then rename."""
    from .torchrt import torch

    t = torch()
    dest = Path(path)
    if dest.is_dir():
        raise UsageError(f"output {dest} is a directory")
    if not dest.parent.is_dir():
        raise UsageError(f"output directory {dest.parent} does not exist")
    values = tuple(o.detach().to("cpu") if isinstance(o, t.Tensor) else o for o in outputs)
    with atomic_write(dest, mode=USER_FILE) as f:  # the user's file: the mode torch.save would give
        t.save(values, f)
    return dest
