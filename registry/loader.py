"""Verify, then trust: load a bundle's programs onto a device and call them by name.

    >>> bundle = load_bundle(materialize_file("model.pt2b", cache_dir), device="cpu")  # doctest: +SKIP
    >>> logits = bundle["decoder"](hidden, targets)
    >>> [r.ok for r in bundle.run_samples()]

Order of operations: compatibility check against the target (``registry.compat``; nothing is
deserialized when it fails) -> pickle scan of the chosen members (refused unless
``trust_pickle``) -> load the chosen variant (portable program moved to the device with
``move_to_device_pass``, or an AOTInductor package) -> every call's inputs checked against the
signature (``registry.signature_check``) before the graph runs.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from .atomic import atomic_write
from .compat import CompatReport, Finding, check, choose_variant
from .errors import (IncompatibleError, InputValidationError, NotFoundError, UnsafeArchiveError, UsageError,
                     brief)
from .manifest import Manifest, ProgramSpec, Variant
from .signature_check import check_inputs
from .sources import MaterializedBundle
from .target import Target

__all__ = ["LoadedBundle", "LoadedProgram", "SampleResult", "load_bundle", "load", "verify_bundle",
           "needs_cpu_isa", "pickle_findings", "save_outputs"]


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

    def __init__(self, spec: ProgramSpec, variant: Variant, device: str, module: Any) -> None:
        self.spec = spec
        self.variant = variant
        self.device = device
        self._module = module

    @property
    def name(self) -> str:
        return self.spec.name

    def __repr__(self) -> str:
        return f"<LoadedProgram {self.name} variant={self.variant.id} device={self.device}>"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        from .torchrt import torch
        from .torchrt_dispatch import bind_call

        flat, args, kwargs = bind_call(args, kwargs, self.spec.raw.get("in_spec"),
                                       self.spec.raw.get("forward_arg_names"))
        constants = self.spec.constant_inputs
        if constants:
            from .samples import check_constant, without_constants

            for c in constants:
                check_constant(c, flat[c["leaf"]] if c["leaf"] < len(flat) else None)
            flat = without_constants(flat, constants)
        check_inputs(self.spec.inputs, flat, device=self.device)
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
        from .samples import call_arguments
        from .torchrt import flatten_outputs
        from .torchrt_dispatch import to_device

        count = len(value) if isinstance(value, (tuple, list)) else None
        full = len(self.spec.inputs) + len(self.spec.constant_inputs)
        if count is not None and count not in (len(self.spec.inputs), full):
            names = ", ".join(i["name"] for i in self.spec.inputs)
            raise InputValidationError(f"program {self.name!r} takes {len(self.spec.inputs)} input(s) "
                                       f"({names}), got {count}")
        args, kwargs = call_arguments(dict(self.spec.raw), value)
        args, kwargs = to_device((args, kwargs), self.device)
        return flatten_outputs(self(*args, **kwargs))


class LoadedBundle:
    """Programs of one bundle loaded for one device, by name: ``bundle["decoder"](x)``."""

    def __init__(self, src: MaterializedBundle, report: CompatReport, target: Target, device: str,
                 programs: Mapping[str, LoadedProgram]) -> None:
        self.source = src
        self.report = report
        self.target = target
        self.device = device
        self._programs = dict(programs)

    @property
    def manifest(self) -> Manifest:
        return self.source.manifest

    @property
    def digest(self) -> str:
        return self.source.digest

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
        from .samples import compare_outputs, read_sample

        results = []
        for s in self.manifest.samples:
            if s.program not in self._programs:
                continue
            program = self._programs[s.program]
            inputs, expected = read_sample(self.source.member_file(s.member), list(s.inputs), list(s.outputs))
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
            rows = compare_outputs(actual, expected, s.rtol, s.atol)
            results.append(SampleResult(s.name, s.program, program.variant.id, all(r["ok"] for r in rows),
                                        tuple(rows), s.rtol, s.atol))
        return results


def needs_cpu_isa(manifest: Manifest) -> bool:
    """Whether choosing a variant depends on the CPU ISA (an AOTInductor CPU variant exists)."""
    return any(v.kind == "aoti" and (v.target.get("device_key") or "cpu") == "cpu"
               for p in manifest.programs.values() for v in p.variants)


def _resolve_target(src: MaterializedBundle, device: str | None, target: Target | None) -> Target:
    if target is not None:
        return target
    from .target import op_key
    from .target_probe import probe

    needed = {op_key(op["name"], op["overload"]) for spec in src.manifest.programs.values()
              for op in spec.required_ops}
    return probe(device, cpu_isa=needs_cpu_isa(src.manifest), ops=sorted(needed))


def _pickled(src: MaterializedBundle, report: CompatReport) -> list[tuple[str, str, list[str]]]:
    """(program, member, pickled entries) for each chosen variant torch would unpickle from."""
    from .pt2.reader import open_pt2

    out = []
    for name, (vid, _) in report.choices.items():
        variant = next((v for v in src.manifest.programs[name].variants if v.id == vid), None)
        if variant is not None:
            entries = open_pt2(src.member_file(variant.member), where=variant.member).pickled
            if entries:
                out.append((name, variant.member, entries))
    return out


def _pickle_message(name: str, member: str, entries: list[str]) -> str:
    more = f" (+{len(entries) - 3} more)" if len(entries) > 3 else ""
    return f"program {name!r} ({member}) holds pickled data: {', '.join(entries[:3])}{more}"


def pickle_findings(src: MaterializedBundle, report: CompatReport, *, trust_pickle: bool = False
                    ) -> list[Finding]:
    """Members of the chosen variants that torch would unpickle when loading them: errors
    (the load would be refused, exit 5) unless the user trusts the bundle."""
    return [Finding("warning" if trust_pickle else "error", "pickle", name,
                    _pickle_message(name, member, entries),
                    "unpickling runs code chosen by whoever made the file",
                    "load it only if you trust the publisher (--trust-pickle)")
            for name, member, entries in _pickled(src, report)]


def native_code_findings(src: MaterializedBundle, report: CompatReport) -> list[Finding]:
    """A warning for each chosen AOTInductor variant: loading it maps a compiled shared library
    into this process, which no check of ours can vet the way a graph is vetted."""
    out = []
    for name, (vid, _) in report.choices.items():
        variant = next((v for v in src.manifest.programs[name].variants if v.id == vid), None)
        if variant is not None and variant.kind == "aoti":
            out.append(Finding("warning", "native-code", name,
                               f"program {name!r} would run as AOTInductor variant {vid!r}: a compiled "
                               f"shared library loaded into this process",
                               "native code runs with this process's rights; unlike a graph it cannot "
                               "be checked before it runs",
                               "run it only from a publisher you trust: require their signature with "
                               "--require-signature KEY"))
    return out


def verify_bundle(src: MaterializedBundle, *, device: str | None = None, target: Target | None = None,
                  trust_pickle: bool = False) -> CompatReport:
    """Every check but the load: compatibility with the target and the pickle scan, all at once.

    >>> report = verify_bundle(src, target=Target.load("box.json"))      # doctest: +SKIP
    >>> report.compatible, [f.message for f in report.findings]
    """
    target = _resolve_target(src, device, target)
    report = check(src.manifest, target, device)
    extra = pickle_findings(src, report, trust_pickle=trust_pickle) + native_code_findings(src, report)
    compatible = report.compatible and not any(f.severity == "error" for f in extra)
    return CompatReport(compatible, report.findings + tuple(extra), report.choices)


def load_bundle(src: MaterializedBundle, *, device: str = "cpu", target: Target | None = None,
                trust_pickle: bool = False, programs: Sequence[str] | None = None) -> LoadedBundle:
    """Check the bundle against ``target`` (default: ``probe(device)``), then load it on ``device``.

    Raises IncompatibleError (exit 4, ``.findings``) before any deserialization when an error
    rule fires, and UnsafeArchiveError (exit 5) for pickled members unless ``trust_pickle``.
    ``programs`` limits loading to some program names.
    """
    wanted = list(programs) if programs is not None else list(src.manifest.programs)
    unknown = [p for p in wanted if p not in src.manifest.programs]
    if unknown:
        raise NotFoundError(f"bundle has no program {unknown[0]!r}; programs: "
                            f"{', '.join(src.manifest.programs)}", what="program", name=unknown[0])
    target = _resolve_target(src, device, target)
    report = check(src.manifest, target, device)
    # Problems of programs not being loaded do not block the ones that are.
    errors = [f for f in report.errors if f.program is None or f.program in wanted]
    if errors:
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise IncompatibleError(f"{src.label or src.digest} cannot run on {device}: {errors[0].message}{more}",
                                findings=list(report.findings), hint=errors[0].fix or None)
    if not trust_pickle:
        for name, member, entries in _pickled(src, report):
            if name in wanted:
                raise UnsafeArchiveError(f"{_pickle_message(name, member, entries)}; refusing to load it",
                                         member=member, hint="pass --trust-pickle (trust_pickle=True) "
                                         "only if you trust the publisher")
    loaded = {}
    for name in wanted:
        spec = src.manifest.programs[name]
        variant, reason = choose_variant(spec, target, device)
        if variant is None:  # the aoti-target rule already failed the report; kept for safety
            raise IncompatibleError(f"program {name!r}: {reason}", findings=list(report.findings))
        loaded[name] = LoadedProgram(spec, variant, device, _load_variant(src, spec, variant, device))
    return LoadedBundle(src, report, target, device, loaded)


def _load_variant(src: MaterializedBundle, spec: ProgramSpec, variant: Variant, device: str) -> Any:
    from . import torchrt, torchrt_dispatch

    path = src.member_file(variant.member)
    if variant.kind == "aoti":
        return torchrt_dispatch.load_aoti(path, variant.archive_name, device)
    ep = torchrt.load_exported_program(path, variant.archive_name)
    baked_elsewhere = any(b["device"].split(":")[0] != device.split(":")[0] for b in spec.baked_devices)
    if device != "cpu" or baked_elsewhere:
        ep = torchrt_dispatch.move_to_device(ep, device)
    return torchrt.restore_guards(ep).module()


def load(source: str | os.PathLike | MaterializedBundle, *, device: str = "cpu",
         target: Target | None = None, trust_pickle: bool = False, imports: Sequence[str] = (),
         libraries: Sequence[str] = (), cache_dir: str | os.PathLike | None = None,
         programs: Sequence[str] | None = None, require_signature: Sequence[str] = ()) -> LoadedBundle:
    """``registry.load``: a bundle file, a registry ref or a materialized bundle, loaded on ``device``.

    >>> bundle = load("team/translator@prod", device="cuda:0", imports=["mylib.ops"])  # doctest: +SKIP
    >>> bundle["decoder"](hidden, targets)
    """
    from .config import Settings
    from .inspection import looks_like_file
    from .sources import materialize_file
    from .torchrt import import_modules, load_libraries

    load_libraries(list(libraries))
    import_modules(list(imports))
    if isinstance(source, MaterializedBundle):
        src = source
    else:
        settings = Settings.resolve()
        text = os.fspath(source)
        if isinstance(source, os.PathLike) or looks_like_file(text):
            src = materialize_file(text, cache_dir or settings.cache_dir)
        else:
            from .client import Registry

            src = Registry(settings).materialize(text)
    if require_signature:  # before anything is deserialized
        from .signing import require_signature as check_signature

        check_signature(src, require_signature)
    return load_bundle(src, device=device, target=target, trust_pickle=trust_pickle, programs=programs)


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
    with atomic_write(dest) as f:
        t.save(values, f)
    return dest
