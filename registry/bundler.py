"""Build `.pt2b` bundles from `.pt2` files or live ExportedPrograms.

Facts come from the serialized graph (``registry.pt2``), never from deserializing the program,
so a program whose custom op is not registered here still bundles. Only golden samples need the
program to run, and therefore its ops registered (``--import``). For example::

    result = build_bundle("out.pt2b", [ProgramInput("encoder", "enc.pt2")],
                          metadata={"owner": "nlp"})
    result.digest, result.warnings
"""
from __future__ import annotations

import filecmp
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .constants import BUNDLE_FORMAT, UNNAMED_PROGRAM_HINT
from .digests import sha256_stream
from .errors import NotFoundError, UnsafeArchiveError, UsageError
from .format.bundle import PLACEHOLDER, FileRange, write_bundle
from .format.chunking import MIN_CHUNK, MIN_MEMBER, entry_span, plan_chunks
from .format.manifest import AotiTarget, Manifest, Member, ProgramSpec, Sample, Variant, baked_device_groups, evolve
from .format.zipsafe import read_entries
from .pt2.graph import HARDWARE_DTYPES
from .pt2.normalize import fill_holes, normalize_pt2
from .pt2.reader import Pt2Archive, open_pt2
from .pt2.verdicts import pickled_of, program_kinds, write_verdict
from .runtime.device import Device

__all__ = ["ProgramInput", "SampleInput", "BuildResult", "build_bundle", "bundle_exported_programs",
           "add_variants", "aoti_target", "aoti_variant_id", "DEFAULT_RTOL", "DEFAULT_ATOL"]

DEFAULT_RTOL = 1e-4
DEFAULT_ATOL = 1e-5
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,127}$")
_META_KEY = re.compile(r"^[^\s=][^=]{0,255}$")


@dataclass(frozen=True)
class ProgramInput:
    """One ``NAME=PATH.pt2`` argument. ``name=None`` keeps the archive's own program names."""

    name: str | None
    path: str | os.PathLike
    dim_names: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SampleInput:
    """Golden sample inputs for a program: an INPUTS.pt path or live tensors (tuple or dict)."""

    program: str
    inputs: Any


@dataclass(frozen=True)
class BuildResult:
    path: Path
    manifest: Manifest
    warnings: tuple[str, ...]
    notes: tuple[str, ...] = ()   # Dim names carried from one program to another (registry.format.dim_names)

    @property
    def digest(self) -> str:
        return self.manifest.digest


def _check_ident(name: str, what: str) -> str:
    if not _IDENT.match(name or ""):
        raise UsageError(f"invalid {what} {name!r}",
                         hint="use letters, digits, '_', '.', '-', starting with a letter or '_'")
    return name


def aoti_target(meta: Mapping[str, str]) -> AotiTarget:
    """The variant's target from the package's AOTI_* metadata (every key written, None or
    not), with the torch that compiled it and its C++ ABI: the package's own record where it
    has one (``pt2reg compile`` writes ``PT2REG_TORCH``/``PT2REG_CXX11_ABI``), else this
    process's torch, the one bundling it (an AOTInductor package is compiled by the torch that
    runs it; the runtime's must be the same major.minor)."""
    from .runtime.torchrt import cxx11_abi, environment

    abi_text = meta.get("PT2REG_CXX11_ABI")
    return evolve(AotiTarget(present=frozenset()),
                  device_key=meta.get("AOTI_DEVICE_KEY", "cpu") or "cpu",
                  compute_capability=meta.get("AOTI_COMPUTE_CAPABILITY") or None,
                  platform=meta.get("AOTI_PLATFORM") or None,
                  machine=meta.get("AOTI_MACHINE") or None,
                  cpu_isa=meta.get("AOTI_CPU_ISA") or None,
                  torch_version=meta.get("PT2REG_TORCH") or environment().get("torch"),
                  cxx11_abi=(abi_text == "1") if abi_text in ("0", "1") else cxx11_abi())


def aoti_variant_id(target: AotiTarget) -> str:
    key = target.device_key
    if target.compute_capability:
        return f"aoti-{key}-sm{target.compute_capability}"
    # The ISA is part of the id: AVX2 and AVX-512 builds of one program are distinct variants.
    isa = "-".join((target.cpu_isa or "").split())
    return "-".join(p for p in ("aoti", key, target.machine or "any", isa) if p).lower()


def _baked_warnings(name: str, prog: ProgramSpec) -> list[str]:
    return [f"program {name!r}: {g.head}, moved to the target device at load"
            + (f": {g.quote}" if g.quote else "") for g in baked_device_groups(prog.baked_devices)]


class _Builder:
    def __init__(self, work: Path, schema_memo: str | os.PathLike | None = None) -> None:
        self.work = work
        self.schema_memo = schema_memo                   # torchrt.op_schemas' memo, or None
        self.programs: dict[str, ProgramSpec] = {}
        self.members: dict[str, Member] = {}             # path -> member entry
        self.files: dict[str, Path] = {}                 # path -> local file with its bytes
        self.ranges: dict[str, tuple[FileRange, ...]] = {}  # path -> where its bytes are (holes)
        self.filled: set[Path] = set()                   # scratch files whose holes were filled
        self.by_sha: dict[str, str] = {}                 # sha256 -> member path (dedup)
        self.normalized: dict[str, tuple[Path, Pt2Archive]] = {}  # program -> portable file
        self.where: dict[str, str] = {}                  # program -> the user's file (for errors)
        self.warnings: list[str] = []
        # member path -> (kind, what it would unpickle) of each program member vetted here
        self.vetted: dict[str, tuple[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {}

    def add_file(self, path: str, local: Path, role: str, extra_spans: Sequence[tuple[int, int]] = (),
                 ranges: tuple[FileRange, ...] = ()) -> str:
        """List ``local`` as member ``path`` (its bytes are ``ranges`` when the file has holes,
        see ``normalize_pt2``). A member of ``MIN_MEMBER`` bytes or more is chunked (at its zip
        entries for a program) and not read here: its chunks are hashed while the bundle is
        written, on every core. An identical file already listed is reused."""
        size = local.stat().st_size
        ranges = ranges or (FileRange(local, 0, size),)
        if size >= MIN_MEMBER:
            spans: list[tuple[int, int]] = []
            if role in ("program", "aoti"):
                spans = [entry_span(e) for e in read_entries(local).values()
                         if not any(e.data_offset <= x < e.data_offset + e.size for x, _ in extra_spans)]
                spans += extra_spans  # an entry holding several weights is split at them instead
            chunks = tuple((PLACEHOLDER, n) for _start, n in plan_chunks(spans, size, min_chunk=1))
            same = next((p for p, m in self.members.items() if m.role == role and m.size == size
                         and [n for _, n in m.chunks] == [n for _, n in chunks]
                         and _outside(self.ranges[p], self.files[p]) == _outside(ranges, local)
                         and filecmp.cmp(self.files[p], local, shallow=False)), None)
            if same is not None:
                return same
            member = Member(path, None, size, role, chunks)
        else:
            with open(local, "rb") as f:
                sha, size = sha256_stream(f)
            if sha in self.by_sha and self.members[self.by_sha[sha]].role == role:
                return self.by_sha[sha]
            self.by_sha[sha] = path
            member = Member(path, sha, size, role)
        if path in self.members:
            raise UsageError(f"two different files would be stored as {path!r}")
        self.members[path] = member
        self.files[path] = local
        self.ranges[path] = ranges
        return path

    def whole_file(self, path: str) -> Path:
        """The local file of member ``path`` with its holes filled (for steps that load it)."""
        local = self.files[path]
        if local not in self.filled:
            fill_holes(local, self.ranges[path])
            self.filled.add(local)
        return local

    def add_program(self, src: ProgramInput, index: int) -> None:
        where = os.fspath(src.path)
        if not os.path.exists(where):
            raise NotFoundError(f"program file {where} not found", what="file", name=where)
        archive = open_pt2(where, where=where, describe=False)  # vetted in full once canonical
        norm = self.work / f"p{index}.pt2"
        # a portable program's weights stay where they are: the bundle copies them once
        ranges = normalize_pt2(archive, norm, holes=bool(archive.programs))
        archive = open_pt2(norm, where=where, canonical=True,
                           dim_names={p: dict(src.dim_names) for p in archive.programs})
        if archive.programs:
            self._add_portable(src, archive, norm, where, ranges)
        else:
            self._add_aoti(src, archive, norm, where)

    def _add_portable(self, src: ProgramInput, archive: Pt2Archive, norm: Path, where: str,
                      ranges: tuple[FileRange, ...]) -> None:
        inner = list(archive.programs)
        if src.name is not None and len(inner) != 1:
            raise UsageError(f"{where} holds {len(inner)} programs ({', '.join(inner)}); "
                             f"pass it without NAME= to bundle them under their own names")
        for inner_name in inner:
            name = _check_ident(src.name or inner_name, "program name")
            if name in self.programs:
                raise UsageError(f"program {name!r} given twice",
                                 hint="give an AOTInductor package the same name to add it as a variant")
            member = self.add_file(f"programs/{name}.pt2", norm, "program", ranges=ranges)
            self.vetted[member] = ("exported_program", pickled_of(archive))
            from .runtime.torchrt import op_schemas

            # the reader's description (JSON values) with the variants it lacks, then typed
            desc = ProgramSpec.from_json(name, {**archive.programs[inner_name], "variants": [
                Variant("portable", "exported_program", member, inner_name).to_json()]})
            # the schemas of the operators it calls are this torch's registrations
            schema = op_schemas([op.target for op in (*desc.required_ops, *desc.operators)], self.schema_memo)
            desc = evolve(desc, required_ops=tuple(evolve(op, schema=schema[op.target]) for op in desc.required_ops),
                          operators=tuple(evolve(op, schema=schema[op.target]) for op in desc.operators),
                          serialization=evolve(desc.serialization, archive_version=archive.archive_version))
            self.programs[name] = desc
            self.normalized[name] = (norm, archive)
            self.where[name] = where
            self.warnings.extend(_baked_warnings(name, desc))

    def _add_aoti(self, src: ProgramInput, archive: Pt2Archive, norm: Path, where: str) -> None:
        if src.name is None or src.name not in self.programs:
            raise UsageError(f"{where} is an AOTInductor package; give it as NAME={where} after the "
                             f"portable program NAME=PROGRAM.pt2 it was compiled from")
        prog = self.programs[src.name]
        for inner_name, info in archive.aoti.items():
            target = aoti_target(info["metadata"])
            vid = _check_ident(aoti_variant_id(target), "variant id")
            if prog.variant(vid) is not None:
                raise UsageError(f"program {src.name!r} already has a variant for {vid}")
            portable = prog.portable
            member = self.add_file(f"programs/{src.name}.{vid}.pt2", norm, "aoti", _weights_in_blobs(
                norm, self.whole_file(portable.member) if portable else self.normalized[src.name][0]))
            self.vetted[member] = ("aoti", pickled_of(archive))
            prog = evolve(prog, variants=prog.variants + (Variant(vid, "aoti", member, inner_name, target),))
            self.programs[src.name] = prog

    def write_verdicts(self, manifest: Manifest, vetted_dir: str | os.PathLike | None) -> None:
        """Remember, in ``vetted_dir`` (``registry.pt2.verdicts``), that each program member
        vetted here passed, under its final identity (only known once the bundle is written),
        so the push and the first load of this bundle on this machine need not vet it again.

        The check here is the one push and load run: ``open_pt2(canonical=True)`` on the
        member's canonical bytes. ``dim_names`` only add Dim names to the description (no
        check reads them, none is skipped without them), and the kind is the one they would
        pass (a member whose manifest kind differs gets no verdict). The bytes checked are the
        member's, except the weights a portable program's scratch file leaves as holes
        (``normalize_pt2``): no check reads a payload's bytes, only its zip entry's size and
        CRC, which the scratch file holds as the bundle does (its writer checks that CRC)."""
        if vetted_dir is None:
            return
        kinds = program_kinds(manifest)
        for path, (kind, (tensors, objects)) in self.vetted.items():
            member = manifest.member(path)
            if member is not None and kinds.get(path) == kind:
                write_verdict(vetted_dir, member.digest, kind, tensors, objects)


def _outside(ranges: Sequence[FileRange], local: Path) -> list[tuple[Path, int, int]]:
    """The parts of a member that are not in its own scratch file (weights left in the source)."""
    return [(r.path, r.offset, r.size) for r in ranges if r.path != local]


def _weights_in_blobs(package: Path, portable: Path) -> list[tuple[int, int]]:
    """Where the portable program's weights lie, byte for byte, inside an AOTInductor package's
    ``*_weights.blob`` (compiled with ``package_constants_in_so=False`` and
    ``package_constants_on_disk_format="binary_blob"``: raw weights back to back). Each becomes a
    chunk of its own, the same chunk as that weight in the portable program, so the variant
    dedups against it in the store. Empty for a package whose weights are inside its `.so`."""
    import mmap

    blobs = [e for e in read_entries(package).values() if e.name.endswith("_weights.blob") and e.size >= MIN_CHUNK]
    weights = [e for e in read_entries(portable).values()
               if "/data/weights/" in e.name and not e.name.endswith(".json") and e.size >= MIN_CHUNK]
    if not blobs or not weights:
        return []
    spans: list[tuple[int, int]] = []
    with open(package, "rb") as pf, open(portable, "rb") as wf, \
            mmap.mmap(pf.fileno(), 0, access=mmap.ACCESS_READ) as pkg, \
            mmap.mmap(wf.fileno(), 0, access=mmap.ACCESS_READ) as port:
        for blob in blobs:
            end = blob.data_offset + blob.size
            for w in weights:
                head = port[w.data_offset:w.data_offset + 64]
                at, tries = pkg.find(head, blob.data_offset, end), 0
                while at != -1 and tries < 8:  # a repeated pattern (zeros) is not searched for long
                    if at + w.size <= end and pkg[at:at + w.size] == port[w.data_offset:w.data_offset + w.size]:
                        if not any(a < at + w.size and at < a + n for a, n in spans):
                            spans.append((at, w.size))
                        break
                    at, tries = pkg.find(head, at + 1, end), tries + 1
    return spans


def _torch_requirement(programs: Mapping[str, ProgramSpec]) -> str | None:
    """``>=X.Y``: the oldest torch that reads every program, from what each uses (its window,
    ``registry.pt2.window``), not from the torch that exported it; a program without a window
    (an AOTInductor-only one) counts as its exporter's version."""
    from .pt2.window import oldest_release

    releases = []
    for p in programs.values():
        if p.serialization.window is not None:
            releases.append(p.serialization.window.torch)
            continue
        m = re.match(r"^(\d+)\.(\d+)", p.serialization.torch_version)
        if m:
            releases.append(f"{m.group(1)}.{m.group(2)}")
    return f">={oldest_release(*releases)}" if releases else None


def build_bundle(out: str | os.PathLike, programs: Sequence[ProgramInput], *,
                 samples: Sequence[SampleInput] = (), metadata: Mapping[str, str] | None = None,
                 rtol: float = DEFAULT_RTOL, atol: float = DEFAULT_ATOL,
                 torch_requirement: str | None = None, device_types: Sequence[str] | None = None,
                 build_info: Mapping[str, Any] | None = None, trust_pickle: bool = False,
                 dim_names: Mapping[str | None, Mapping[str, str]] | None = None,
                 vetted_dir: str | os.PathLike | None = None,
                 schema_memo: str | os.PathLike | None = None) -> BuildResult:
    """Bundle `.pt2` files (and AOTInductor packages as variants) into ``out`` atomically.

    ``dim_names``: program -> {symbol (``s31``) or ``INPUT.D``: Dim name}; names are also
    carried to other programs' inputs at the same position (``registry.format.dim_names``).
    ``vetted_dir``: where this machine keeps vetting verdicts (``registry.pt2.verdicts``, the
    client cache's ``vetted-programs``); each program member vetted here gets one, so pushing
    or loading this bundle here does not vet it again. ``schema_memo``: where this machine
    remembers the schemas of torch's operators per torch installation (the client cache's
    ``op-schemas``, ``runtime.torchrt.op_schemas``): a bundle of known operators then needs no
    ``import torch``."""
    if not programs:
        raise UsageError("no programs given", hint="pass PATH.pt2 or NAME=PATH.pt2")
    meta = {}
    for k, v in (metadata or {}).items():
        if not _META_KEY.match(str(k)):
            raise UsageError(f"invalid metadata key {k!r}")
        meta[str(k)] = str(v)
    out = Path(out)
    if out.exists() and out.is_dir():
        raise UsageError(f"output {out} is a directory")
    work = Path(tempfile.mkdtemp(prefix="pt2reg-bundle-"))
    try:
        b = _Builder(work, schema_memo)
        for i, src in enumerate(programs):
            b.add_program(src, i)
        from .format.dim_names import name_dims

        dim_notes = name_dims(b.programs, dim_names)
        sample_entries = _build_samples(b, samples, rtol, atol, trust_pickle)
        hw = sorted({d for p in b.programs.values() for d in p.dtypes} & HARDWARE_DTYPES)
        from .runtime.torchrt import environment

        raw = {  # the JSON edge: written from the typed parts, validated and parsed back
            "format": BUNDLE_FORMAT,
            "kind": "pt2-bundle",
            "programs": {name: prog.to_json() for name, prog in b.programs.items()},
            # JSON objects are canonical with sorted keys: the order given is kept explicitly
            # (only with several programs, so a one-program bundle's digest is unchanged)
            **({"program_order": list(b.programs)} if len(b.programs) > 1 else {}),
            "members": [m.to_json() for m in sorted(b.members.values(), key=lambda m: m.path)],
            "samples": [s.to_json() for s in sample_entries],
            "requirements": {
                "torch": torch_requirement if torch_requirement is not None else _torch_requirement(b.programs),
                "device_types": sorted(device_types) if device_types else None,
                "hardware_dtypes": hw,
            },
            "metadata": meta,
            "environment": environment(),
        }
        draft = Manifest.from_raw(raw)   # chunk digests still PLACEHOLDER: filled while writing
        sources = dict(b.ranges)
        manifest = write_bundle(out, draft, sources, build=dict(build_info) if build_info else None,
                                fill_digests=True)
        b.write_verdicts(manifest, vetted_dir)
        return BuildResult(out, manifest, tuple(b.warnings), tuple(dim_notes))
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _build_samples(b: _Builder, samples: Sequence[SampleInput], rtol: float, atol: float,
                   trust_pickle: bool = False) -> list[Sample]:
    if not samples:
        return []
    from .runtime.inputs import call_arguments, without_constants
    from .runtime.samples import run_program, write_sample
    from .runtime.torchrt import load_inputs_file, tree_flatten

    modules: dict[str, tuple[Any, Device]] = {}  # program -> (module, the device it runs on)
    entries = []
    counts: dict[str, int] = {}
    for s in samples:
        if s.program not in b.programs:
            raise UsageError(f"sample for unknown program {s.program!r}; programs: {', '.join(b.programs)}",
                             hint=UNNAMED_PROGRAM_HINT)
        value = load_inputs_file(s.inputs) if isinstance(s.inputs, (str, os.PathLike)) else s.inputs
        if s.program not in modules:
            _norm, archive = b.normalized[s.program]
            if archive.pickled and not trust_pickle:
                raise UnsafeArchiveError(
                    f"program {s.program!r} stores pickled data ({', '.join(archive.pickled[:3])}); computing "
                    f"samples would unpickle it", member=archive.pickled[0],
                    hint="bundle without --sample, or pass --trust-pickle if you trust this file")
            inner = b.programs[s.program].variants[0].archive_name
            modules[s.program] = _load_for_samples(b.whole_file(b.programs[s.program].variants[0].member), inner,
                                                   b.programs[s.program], b.where.get(s.program), s.program)
        program = b.programs[s.program]
        args, kwargs = call_arguments(program, value)
        flat_inputs, _ = tree_flatten((args, kwargs))
        flat_inputs = without_constants(flat_inputs, program.constant_inputs)  # put back at run
        module, device = modules[s.program]
        outputs = run_program(module, program, value, device)
        k = counts.get(s.program, 0)
        counts[s.program] = k + 1
        local = b.work / f"sample-{s.program}-{k}.safetensors"
        in_keys, out_keys = write_sample(local, flat_inputs, outputs)
        member = b.add_file(f"samples/{s.program}.{k}.safetensors", local, "sample")
        entries.append(Sample(f"{s.program}-{k}", s.program, member, tuple(in_keys), tuple(out_keys), rtol, atol,
                              device=device.type))
    return entries


def _load_for_samples(path: Path, inner: str, program: ProgramSpec, label: str | None = None,
                      name: str | None = None) -> tuple[Any, Device]:
    """The program ready to compute its golden samples, and the device it runs on: the device
    it was exported on when this machine has it, else the CPU (``samples.sample_device``),
    placed there as the loader places it (weights loaded on the CPU, then moved)."""
    from .errors import IncompatibleError
    from .runtime.loader import place_program
    from .runtime.samples import sample_device
    from .runtime.torchrt import load_exported_program, op_schema

    missing = [op.name for op in program.required_ops if op_schema(op.target) is None]
    if missing:
        raise IncompatibleError(
            f"cannot compute golden samples: custom op {missing[0]} is not registered in this process",
            hint="pass --import MODULE (or --load-library PATH.so) that registers it, or bundle without --sample")
    from .runtime.compat import pytree_classes_of
    from .runtime.torchrt import stand_in_pytree_classes

    stand_in_pytree_classes(pytree_classes_of(program))  # library output classes
    device = sample_device(program)
    ep = load_exported_program(path, inner, label=label, program=name)
    return place_program(ep, program, device), device


def bundle_exported_programs(out: str | os.PathLike, programs: Mapping[str, Any], *,
                             dynamic_shapes: Mapping[str, Any] | None = None,
                             samples: Mapping[str, Sequence[Any]] | None = None,
                             metadata: Mapping[str, str] | None = None, **kwargs: Any) -> BuildResult:
    """Bundle live ``ExportedProgram``s, keeping the user's ``Dim`` names (``kwargs``: those of
    ``build_bundle``, ``vetted_dir`` included).

    >>> bundle_exported_programs("m.pt2b", {"encoder": ep}, dynamic_shapes={"encoder": ds},
    ...                          samples={"encoder": [(tokens,)]})           # doctest: +SKIP
    """
    from .runtime.torchrt import dim_names_of, save_exported_program

    work = Path(tempfile.mkdtemp(prefix="pt2reg-eps-"))
    try:
        inputs = []
        for name, ep in programs.items():
            path = work / f"{_check_ident(name, 'program name')}.pt2"
            names = dim_names_of(ep, (dynamic_shapes or {}).get(name))
            save_exported_program(ep, path)
            inputs.append(ProgramInput(name, path, names))
        sample_inputs = [SampleInput(p, v) for p, vals in (samples or {}).items() for v in vals]
        return build_bundle(out, inputs, samples=sample_inputs, metadata=metadata, **kwargs)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def add_variants(out: str | os.PathLike, manifest: Manifest, files: Mapping[str, Path],
                 packages: Sequence[tuple[str, str | os.PathLike]], *,
                 metadata: Mapping[str, str] | None = None,
                 build_info: Mapping[str, Any] | None = None,
                 vetted_dir: str | os.PathLike | None = None) -> BuildResult:
    """A new bundle at ``out``: everything of ``manifest`` (its members are the verified local
    ``files``: programs, variants, golden samples, metadata, Dim names) plus each AOTInductor
    package of ``packages`` (``(program, path)``) as a variant of that program, its weights
    chunked at the portable program's (``_weights_in_blobs``). ``metadata`` is merged in.
    ``vetted_dir``: as for ``build_bundle``; only the packages added here are vetted (and get a
    verdict), the manifest's own members are not read as programs."""
    out = Path(out)
    work = Path(tempfile.mkdtemp(prefix="pt2reg-variants-"))
    try:
        b = _Builder(work)
        b.programs = dict(manifest.programs)
        owner = {v.member: p for p in manifest.programs.values() for v in p.variants}
        for m in manifest.members:
            extra: list[tuple[int, int]] = []
            prog = owner.get(m.path)
            if m.role == "aoti" and prog is not None and prog.portable is not None:
                extra = _weights_in_blobs(files[m.path], files[prog.portable.member])
            b.add_file(m.path, files[m.path], m.role, extra)
        for i, (program, package) in enumerate(packages):
            if program not in b.programs:
                raise UsageError(f"no program {program!r} to add a variant to; programs: {', '.join(b.programs)}")
            b.add_program(ProgramInput(program, package), i)
        raw = manifest.to_json()
        raw["programs"] = {name: prog.to_json() for name, prog in b.programs.items()}
        raw["members"] = [m.to_json() for m in sorted(b.members.values(), key=lambda m: m.path)]
        raw["metadata"] = {**raw["metadata"], **{str(k): str(v) for k, v in (metadata or {}).items()}}
        manifest = write_bundle(out, Manifest.from_raw(raw), dict(b.ranges),
                                build=dict(build_info) if build_info else None, fill_digests=True)
        b.write_verdicts(manifest, vetted_dir)
        return BuildResult(out, manifest, tuple(b.warnings))
    finally:
        shutil.rmtree(work, ignore_errors=True)
