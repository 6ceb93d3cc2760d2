"""``pt2reg export-triton``: a Triton model repository for the PyTorch backend's AOTInductor
platform (``backend: "pytorch"``, ``platform: "torch_aoti"``, Triton 26.03+).

What the backend expects (triton-inference-server/pytorch_backend, README "AOT Inductor Support"
and src/pt2/model_state.cc): ``<repo>/<model>/<version>/<file>.pt2`` loaded with
``AOTIModelPackageLoader(path, "model")`` (model name "model" inside the package; file
``model.pt2`` unless the config names another); tensors named by position in the call spec,
``INPUT__<i>`` / ``OUTPUT__<i>``; only tensor leaves. Triton core picks the file of a GPU
instance from ``cc_model_filenames`` keyed ``"<major>.<minor>"`` of the device's compute
capability, else ``default_model_filename``. The config text is made here from the manifest
alone (``triton_config``: pure); ``export_triton`` verifies, copies and writes atomically.
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import ConflictError, IncompatibleError, UnsafeArchiveError, UsageError
from ..format.manifest import Dim, ProgramSpec, TensorSpec, Variant

if TYPE_CHECKING:
    from ..client.sources import MaterializedBundle
    from ..runtime.target import Target

__all__ = ["TRITON_DTYPES", "TritonModel", "plan_models", "triton_config", "export_triton", "write_repository",
           "cc_key", "check_model_name"]

#: torch dtype (as the manifest names it) -> Triton's DataType
TRITON_DTYPES = {"bool": "TYPE_BOOL", "uint8": "TYPE_UINT8", "uint16": "TYPE_UINT16", "uint32": "TYPE_UINT32",
                 "uint64": "TYPE_UINT64", "int8": "TYPE_INT8", "int16": "TYPE_INT16", "int32": "TYPE_INT32",
                 "int64": "TYPE_INT64", "float16": "TYPE_FP16", "float32": "TYPE_FP32", "float64": "TYPE_FP64",
                 "bfloat16": "TYPE_BF16"}
PACKAGE_MODEL_NAME = "model"   # the model name the backend loads from a package (INDUCTOR_MODEL_NAME_DEFAULT)


def cc_key(compute_capability: str) -> str:
    """``AOTI_COMPUTE_CAPABILITY`` ("90", "120") as Triton core keys ``cc_model_filenames`` ("9.0")."""
    cc = compute_capability.strip()
    if "." in cc:
        return cc
    return f"{cc[:-1]}.{cc[-1]}"


@dataclass(frozen=True)
class TritonModel:
    """One Triton model: a program and the AOTI variants it serves, each under its file name."""

    name: str
    program: ProgramSpec
    files: tuple[tuple[Variant, str], ...]     # (variant, file name in the version directory)
    default_file: str
    kind: str                                  # KIND_CPU | KIND_GPU
    skipped: tuple[str, ...] = ()              # variant ids not served (another device kind)

    @property
    def cc_files(self) -> dict[str, str]:
        return {cc_key(v.target.compute_capability): f for v, f in self.files
                if v.target is not None and v.target.compute_capability}


def _model_files(program: ProgramSpec) -> tuple[tuple[tuple[Variant, str], ...], str, str, tuple[str, ...]]:
    aoti = [v for v in program.variants if v.kind == "aoti"]
    cuda = [v for v in aoti if v.target is not None and (v.target.device_key or "cpu") == "cuda"
            and v.target.compute_capability]
    if cuda:  # a GPU model: one file per compute capability, the newest also the default
        cuda.sort(key=lambda v: int(v.target.compute_capability.replace(".", "")))  # type: ignore[union-attr]
        files = tuple((v, f"model.sm_{v.target.compute_capability.replace('.', '')}.pt2")  # type: ignore[union-attr]
                      for v in cuda)
        return files, files[-1][1], "KIND_GPU", tuple(v.id for v in aoti if v not in cuda)
    cpu = [v for v in aoti if v.target is None or (v.target.device_key or "cpu") == "cpu"]
    if not cpu:
        return (), "", "", tuple(v.id for v in aoti)
    # several CPU builds (AVX2, AVX-512) cannot be told apart by Triton: the first is served
    return ((cpu[0], "model.pt2"),), "model.pt2", "KIND_CPU", tuple(v.id for v in aoti if v is not cpu[0])


def _tensor_problem(t: TensorSpec, what: str) -> str | None:
    if t.shape is None:
        return f"{what} {t.name!r} is a {t.dtype}, not a tensor (the backend takes tensors only)"
    if t.dtype not in TRITON_DTYPES:
        return f"{what} {t.name!r} has dtype {t.dtype}, which Triton has no type for"
    return None


_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}")


def check_model_name(name: str) -> str:
    """A Triton model name is a directory of the repository: one path part, no leading dot."""
    if not _MODEL_NAME.fullmatch(name or ""):
        raise UsageError(f"invalid Triton model name {name!r}",
                         hint="letters, digits, '_', '-', '.' (not first), at most 128 characters")
    return name


def plan_models(programs: Mapping[str, ProgramSpec], model_name: str) -> list[TritonModel]:
    """The Triton models for ``programs`` (one: named ``model_name``; several:
    ``<model_name>_<program>``). IncompatibleError (exit 4) when a program has no AOTI variant,
    a variant the backend cannot load, or inputs/outputs it cannot take."""
    check_model_name(model_name)
    out = []
    for pname, prog in programs.items():
        files, default, kind, skipped = _model_files(prog)
        if not files:
            raise IncompatibleError(f"program {pname!r} has no AOTInductor variant to serve",
                                    hint="compile one first: pt2reg compile REF (on the serving machine's kind)")
        for v, _ in files:
            if v.archive_name != PACKAGE_MODEL_NAME:
                raise IncompatibleError(f"variant {v.id} of program {pname!r} holds model {v.archive_name!r}; "
                                        f"Triton's PyTorch backend loads model {PACKAGE_MODEL_NAME!r}",
                                        hint="recompile it with pt2reg compile")
        problems = [p for p in ([_tensor_problem(t, "input") for t in prog.inputs]
                                + [_tensor_problem(t, "output") for t in prog.outputs]) if p]
        if problems:
            raise IncompatibleError(f"program {pname!r}: {problems[0]}")
        if prog.required_ops:
            ops = ", ".join(op.name for op in prog.required_ops)
            raise IncompatibleError(f"program {pname!r} needs custom op(s) {ops}; Triton's PyTorch backend "
                                    f"does not check or load them", hint="serve it with the registry's loader")
        name = check_model_name(model_name if len(programs) == 1 else f"{model_name}_{pname}")
        out.append(TritonModel(name, prog, files, default, kind, skipped))
    return out


def _dims(t: TensorSpec, batched: bool) -> list[int]:
    dims = [-1 if isinstance(d, Dim) else int(d) for d in t.shape or ()]
    return dims[1:] if batched else dims


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def triton_config(model: TritonModel, *, max_batch_size: int = 0,
                  parameters: Mapping[str, str] | None = None) -> str:
    """``config.pbtxt`` (protobuf text format of Triton's ``ModelConfig``) for ``model``.
    With ``max_batch_size`` > 0 every tensor's first dim is Triton's batch dim (dynamic)."""
    batched = max_batch_size > 0
    if batched:
        for t in model.program.inputs + model.program.outputs:
            if not t.shape or not isinstance(t.shape[0], Dim):
                raise UsageError(f"--max-batch-size {max_batch_size}: {t.name!r} of program "
                                 f"{model.program.name!r} has no dynamic first dim to batch",
                                 hint="use --max-batch-size 0 (the default)")
            first = t.shape[0]
            if first.min > 1:  # Triton's batcher sends batches of 1 too
                raise UsageError(f"--max-batch-size {max_batch_size}: the first dim of {t.name!r} of program "
                                 f"{model.program.name!r} is at least {first.min}, and Triton sends batches of 1",
                                 hint="export with a batch Dim whose min is 1, or use --max-batch-size 0")
            if first.max is not None and first.max < max_batch_size:
                raise UsageError(f"--max-batch-size {max_batch_size}: the first dim of {t.name!r} of program "
                                 f"{model.program.name!r} is at most {first.max}",
                                 hint=f"use --max-batch-size {first.max} or less")

    def tensors(kind: str, specs: Sequence[TensorSpec], prefix: str) -> list[str]:
        rows = []
        for i, t in enumerate(specs):
            shape = _dims(t, batched)
            # a batch-only tensor ([B]): Triton wants dims, so [ 1 ] reshaped to [ ] (its docs' idiom)
            extra = " reshape: { shape: [ ] }" if batched and not shape else ""
            dims = ", ".join(str(d) for d in shape or ([1] if batched else []))
            rows.append(f"  {{ name: {_q(f'{prefix}__{i}')} data_type: {TRITON_DTYPES[t.dtype]} "
                        f"dims: [ {dims} ]{extra} }}")
        return [f"{kind} ["] + [",\n".join(rows)] + ["]"]

    lines = [f"name: {_q(model.name)}", 'backend: "pytorch"', 'platform: "torch_aoti"',
             f"max_batch_size: {max_batch_size}"]
    lines += tensors("input", model.program.inputs, "INPUT")
    lines += tensors("output", model.program.outputs, "OUTPUT")
    lines += ["instance_group [", f"  {{ kind: {model.kind} count: 1 }}", "]"]
    lines.append(f"default_model_filename: {_q(model.default_file)}")
    for cc, f in model.cc_files.items():
        lines.append(f"cc_model_filenames {{ key: {_q(cc)} value: {_q(f)} }}")
    for k, v in (parameters or {}).items():
        lines.append(f"parameters {{ key: {_q(k)} value: {{ string_value: {_q(v)} }} }}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ExportResult:
    outdir: Path
    version: int
    models: tuple[TritonModel, ...]

    def to_json(self) -> dict[str, Any]:
        return {"outdir": str(self.outdir), "version": self.version, "models": [
            {"name": m.name, "program": m.program.name, "kind": m.kind, "default_model_filename": m.default_file,
             "cc_model_filenames": m.cc_files, "files": {f: v.id for v, f in m.files}, "skipped": list(m.skipped)}
            for m in self.models]}


def _default_model_name(src: MaterializedBundle) -> str:
    base = (src.name or src.label or "model").rsplit("/", 1)[-1]
    base = Path(base).name.removesuffix(".pt2b")
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in base) or "model"


def write_repository(src: MaterializedBundle, outdir: str | os.PathLike, models: Sequence[TritonModel], *,
                     version: int, ref: str, max_batch_size: int = 0) -> None:
    """Write ``outdir/<model>/config.pbtxt`` and ``<version>/<file>`` for each model, each
    model directory appearing whole (built beside it, then renamed into place)."""
    outdir = Path(outdir)
    outdir.mkdir(parents=True, exist_ok=True)
    for m in models:
        if (outdir / m.name).exists():
            raise ConflictError(f"{outdir / m.name} already exists", hint="export into an empty directory")
    staged = Path(tempfile.mkdtemp(prefix=".pt2reg-triton-", dir=outdir))
    try:
        for m in models:
            params = {"pt2reg_ref": ref, "pt2reg_digest": src.digest, "pt2reg_program": m.program.name,
                      "pt2reg_variants": ",".join(f"{f}={v.id}" for v, f in m.files)}
            (staged / m.name / str(version)).mkdir(parents=True)
            (staged / m.name / "config.pbtxt").write_text(triton_config(m, max_batch_size=max_batch_size,
                                                                        parameters=params))
            for v, f in m.files:
                shutil.copyfile(src.member_file(v.member), staged / m.name / str(version) / f)
        for m in models:
            os.replace(staged / m.name, outdir / m.name)
    finally:
        shutil.rmtree(staged, ignore_errors=True)


def _vet_files(src: MaterializedBundle, models: Sequence[TritonModel]) -> None:
    """Each file served vetted as the loader vets a variant before torch reads it: canonical zip
    layout, the AOTInductor member allowlist (UnsafeArchiveError, exit 5), and no pickled data
    (the server would unpickle it with no registry in between)."""
    from ..pt2.reader import open_pt2

    for m in models:
        for v, _ in m.files:
            where = f"program {m.program.name!r} ({v.member})"
            archive = open_pt2(src.member_file(v.member), where=where, canonical=True, kind=v.kind)
            if archive.pickled:
                raise UnsafeArchiveError(f"{where}: the package holds pickled data ({', '.join(archive.pickled[:3])}); "
                                         f"Triton would unpickle it", member=v.member)


def export_triton(src: MaterializedBundle, outdir: str | os.PathLike, *, model_name: str | None = None,
                  programs: Sequence[str] = (), max_batch_size: int = 0, trust_native: bool = False,
                  target: Target | None = None) -> ExportResult:
    """Verify ``src`` (on ``target``, default this machine: exit 4/5 on an error finding),
    check the native-code trust rule (exit 5), then write the Triton repository."""
    from ..runtime.loader import native_allowed, verify_bundle

    if max_batch_size < 0:
        raise UsageError("--max-batch-size must be 0 or more")
    wanted = list(programs) or list(src.manifest.programs)
    unknown = [p for p in wanted if p not in src.manifest.programs]
    if unknown:
        raise UsageError(f"no program {unknown[0]!r}; programs: {', '.join(src.manifest.programs)}")
    chosen = {p: src.manifest.programs[p] for p in wanted}
    models = plan_models(chosen, model_name or _default_model_name(src))
    if not native_allowed(src, trust_native):
        raise UnsafeArchiveError(f"{src.label or src.digest}: the Triton repository would serve AOTInductor "
                                 f"variants (compiled native code) from a publisher not trusted here",
                                 hint="require the publisher's signature (--require-signature KEY, or a trust "
                                      "policy rule for the model) or pass --trust-native")
    report = verify_bundle(src, target=target, trust_native=True)
    report.raise_for_status()
    _vet_files(src, models)
    version = src.version or 1
    ref = f"{src.name}@{src.version}" if src.name else (src.label or src.digest)
    write_repository(src, outdir, models, version=version, ref=ref, max_batch_size=max_batch_size)
    return ExportResult(Path(outdir), version, tuple(models))
