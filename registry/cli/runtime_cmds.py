"""``pt2reg target``, ``pt2reg verify`` and ``pt2reg run``: the loader on the command line.

Exit codes follow the contract: 0 ok, 2 usage, 3 not found, 4 incompatible (including inputs
that do not match the signature), 5 integrity/safety (e.g. pickled members without
``--trust-pickle``), 1 anything else -- including ``run --samples`` when a sample's outputs are
outside tolerance (the bundle loaded and ran, but its numbers differ on this target).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from ._core import DEVICE, App, emit_json, pass_app, status, warn
from .render import clean, esc

if TYPE_CHECKING:
    from ..client.sources import MaterializedBundle
    from ..runtime.compat import CompatReport
    from ..runtime.device import Device
    from ..runtime.target import Target

__all__ = ["target", "verify", "run"]

_IMPORT_HELP = "Import a module that registers custom ops first (repeatable)."
_LIBRARY_HELP = "Load a compiled custom-op library first (repeatable)."
_SIGNATURE_HELP = ("Require a valid signature by this public key (repeatable); a bundle it signed is trusted "
                   "(its AOTInductor variants may run, no sandbox).")
_NATIVE_HELP = ("Allow AOTInductor variants (compiled native code) of a bundle no trusted key signed; "
                "without it they are skipped for the portable program.")


def _console() -> Any:
    from rich.console import Console

    # Piped output is read by scripts and grep: do not wrap lines at 80 columns.
    return Console(highlight=False, width=None if sys.stdout.isatty() else 240)


def _open(app: App, source: str, pubkeys: tuple[str, ...], *, defer_weights: bool = False,
          in_place: Callable[[MaterializedBundle], bool] | None = None) -> MaterializedBundle:
    """The bundle file or ref as verified files, the trust policy and ``--require-signature``
    keys enforced (exit 5 before anything is loaded). ``defer_weights``: a ref not cached may
    come back with its raw weights still being fetched (``load_bundle`` settles it), used where
    they lie in a local store where ``in_place`` allows."""
    from ..client.sources import open_source

    return open_source(source, registry=app.registry, require_signature=pubkeys, defer_weights=defer_weights,
                       in_place=in_place)


def _native_notes(report: CompatReport) -> list[dict[str, Any]]:
    """The ``native-code`` findings: which AOTInductor variant was skipped or allowed, and why."""
    return [f.to_json() for f in report.findings if f.code == "native-code"]


def _target_for(src: MaterializedBundle, device: Device | None, target_file: str | None, imports: tuple[str, ...],
                libraries: tuple[str, ...]) -> Target:
    from ..runtime.loader import needed_operators, needs_cpu_isa
    from ..runtime.probe import probe
    from ..runtime.target import Target

    if target_file:
        from ..runtime.torchrt import import_modules, load_libraries

        load_libraries(list(libraries))
        import_modules(list(imports))
        return Target.load(target_file)
    return probe(device, imports, libraries, cpu_isa=needs_cpu_isa(src.manifest),
                 operators=needed_operators(src.manifest))


def _target_line(t: Target) -> str:
    cc = f" sm_{t.compute_capability[0]}{t.compute_capability[1]}" if t.compute_capability else ""
    where = " ".join(p for p in (t.platform, t.machine, t.cpu_isa) if p)
    gpu = f", CUDA {t.cuda_version}" if t.cuda_version else (f", ROCm {t.rocm_version}" if t.rocm_version else "")
    return (f"torch {t.torch_version} (serde {t.serde_schema[0]}.{t.serde_schema[1]}){gpu}, "
            f"{t.device_type}{cc}{', ' + where if where else ''}, {_ops_line(t)}")


def _ops_line(t: Target) -> str:
    """``12 user ops (mylib, other), 355 torch ops``: torch's own namespaces apart from the user's."""
    spaces = t.op_namespaces()
    user, own = sum(spaces["user"].values()), sum(spaces["torch"].values())
    names = f" ({', '.join(spaces['user'])})" if spaces["user"] else ""
    return f"{user} user op{'' if user == 1 else 's'}{names}, {own} torch op{'' if own == 1 else 's'}"


# ---------------------------------------------------------------------------------------- target

@click.command("target")
@click.option("--import", "imports", multiple=True, metavar="MODULE", help=_IMPORT_HELP)
@click.option("--load-library", "libraries", multiple=True, metavar="PATH.so", help=_LIBRARY_HELP)
@click.option("--device", type=DEVICE, metavar="DEV", help="Device to describe (default: cuda:0 if available, else cpu).")
@click.option("--json", "as_json", is_flag=True, help="Print the target as JSON (save it for --target).")
def target(imports: tuple[str, ...], libraries: tuple[str, ...], device: Device | None, as_json: bool) -> None:
    """Describe this machine: torch, serializer, device, compute capability, registered ops.

    \b
    Capture an inference box once and check bundles against it from anywhere:
      pt2reg target --device cuda:0 --import mylib.ops --json > box.json
      pt2reg verify team/model@prod --target box.json
    """
    from ..runtime.probe import probe

    t = probe(device, imports, libraries)
    if as_json:
        emit_json(t.to_json())
        return
    from rich.table import Table

    out = _console()
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column()
    cc = t.compute_capability
    for key, value in (("torch", t.torch_version), ("serde schema", f"{t.serde_schema[0]}.{t.serde_schema[1]}"),
                       ("device type", t.device_type), ("compute capability", f"{cc[0]}.{cc[1]}" if cc else "-"),
                       ("CUDA", t.cuda_version or "-"), ("ROCm", t.rocm_version or "-"),
                       ("platform", f"{t.platform or '-'} {t.machine or ''}".strip()), ("CPU ISA", t.cpu_isa or "-"),
                       ("TorchBind classes", str(len(t.torchbind_classes)))):
        table.add_row(key, esc(value))
    spaces = t.op_namespaces()  # torch's own namespaces apart from user-registered ops
    for label, key in (("user ops", "user"), ("torch ops", "torch")):
        counts = spaces[key]
        table.add_row(label, esc(f"{sum(counts.values())}" + (": " if counts else "") + ", ".join(
            f"{ns} ({n})" for ns, n in counts.items())))
    out.print(table)


# ---------------------------------------------------------------------------------------- verify

@click.command()
@click.argument("source", metavar="BUNDLE|REF")
@click.option("--device", type=DEVICE, metavar="DEV", help="Device to check for (default: the target's device type; "
              "without --target, cuda:0 if available, else cpu).")
@click.option("--target", "target_file", metavar="FILE.json", type=click.Path(dir_okay=False),
              help="Check against a machine described in a file (`pt2reg target --json`) instead of this one.")
@click.option("--import", "imports", multiple=True, metavar="MODULE", help=_IMPORT_HELP)
@click.option("--load-library", "libraries", multiple=True, metavar="PATH.so", help=_LIBRARY_HELP)
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB", help=_SIGNATURE_HELP)
@click.option("--trust-pickle", is_flag=True,
              help="Report pickled members as warnings instead of refusing them (exit 5).")
@click.option("--trust-native", is_flag=True, help=_NATIVE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document with \"compatible\".")
@pass_app
def verify(app: App, source: str, device: Device | None, target_file: str | None, imports: tuple[str, ...],
           libraries: tuple[str, ...], pubkeys: tuple[str, ...], trust_pickle: bool, trust_native: bool,
           as_json: bool) -> None:
    """Check that a bundle can run on a target, without loading it; report every finding.

    Checks the serializer version, torch requirement, device type, hardware dtypes (bf16/fp8),
    custom ops (registered, same schema, kernel for the device), TorchBind classes, AOTInductor
    targets and baked devices, and picks the variant each program would load; members torch
    would unpickle are refused. AOTInductor variants (native code) are chosen only when a
    trusted key signed the bundle (trust policy or --require-signature) or with --trust-native;
    a `native-code` finding says which was skipped. Exit 0 when compatible, 4 when not, 5 for
    pickled members, a missing trusted signature, or a program with only native variants.

    \b
    Which torch can read each program is its window, recorded at bundle time from what the
    program uses (`pt2reg inspect` shows it), not the torch that exported it. A REF checked
    against --target FILE.json is decided from the registry's metadata alone, before any
    download ("can that machine load it?"); its members are checked when it is pulled or run.
    """
    from ..client.sources import parse_source
    from ..runtime.loader import verify_bundle

    # a ref checked against a described machine needs its metadata only: nothing is downloaded
    metadata_only = target_file is not None and not isinstance(parse_source(source), os.PathLike)
    src = app.registry.describe(source, require_signature=pubkeys) if metadata_only else _open(app, source, pubkeys)
    t = _target_for(src, device, target_file, imports, libraries)
    report = verify_bundle(src, device=device, target=t, trust_pickle=trust_pickle, trust_native=trust_native,
                           read_members=not metadata_only or bool(src.files or src.ranges))
    signed = _signature_lines(app, src, pubkeys)
    if as_json:
        emit_json({**report.to_json(), "digest": src.digest, "device": str(device or t.device_type),
                   "target": t.summary(), "signatures": signed})
    else:
        _print_report(src, t, str(device or t.device_type), report)
        for line in signed:
            _console().print(esc(line["text"]))
    report.raise_for_status()  # exit 5 for pickled members or native-only programs, else 4


def _signature_lines(app: App, src: MaterializedBundle, pubkeys: tuple[str, ...]) -> list[dict[str, Any]]:
    """Which keys signed the bundle and which of them were checked here (the trust policy's
    keys and ``--require-signature``'s): ``signed by release.pub (OMS, team/m@4): verified``."""
    from ..format.signing import key_id_of, public_key_from_pem, read_public_key_file
    from .views import signatures_json

    extra = {}
    for path in pubkeys:
        key = public_key_from_pem(read_public_key_file(path).encode("ascii"), path)
        extra[key_id_of(key)] = (key, os.path.basename(path))
    return signatures_json(app.registry, digest=src.digest, name=src.name, version=src.version,
                           signatures=src.signatures, extra_keys=extra)


def _print_report(src: MaterializedBundle, t: Target, device: str, report: CompatReport) -> None:
    from rich.table import Table

    out = _console()
    out.print(f"[bold]{esc(src.label or src.digest)}[/bold]  {esc(src.digest)}")
    out.print(f"target: {esc(_target_line(t))}; device {esc(device)}")
    variants = Table(title="variants", title_justify="left", box=None, pad_edge=False, header_style="bold")
    for col in ("program", "variant", "why"):
        variants.add_column(col)
    for name, (vid, why) in report.choices.items():
        variants.add_row(esc(name), esc(vid) if vid else "[red]none[/red]", esc(why))
    out.print(variants)
    if report.findings:
        table = Table(title="findings", title_justify="left", box=None, pad_edge=False, header_style="bold")
        for col in ("", "code", "program", "finding", "fix"):
            table.add_column(col)
        for f in report.findings:
            sev = {"error": "[red]error[/red]", "warning": "[yellow]warning[/yellow]"}.get(f.severity,
                                                                                          "[dim]info[/dim]")
            table.add_row(sev, esc(f.code), esc(f.program or "-"), esc(f.message), esc(f.fix))
        out.print(table)
    verdict = "[green]compatible[/green]" if report.compatible else "[red]not compatible[/red]"
    out.print(f"{verdict}: {len(report.errors)} error(s), {len(report.warnings)} warning(s)")


# ---------------------------------------------------------------------------------------- run

def _describe_output(index: int, value: Any) -> dict[str, Any]:
    """dtype and shape of a tensor output; a Python scalar (an int size, a bool) as itself."""
    if hasattr(value, "dtype") and hasattr(value, "shape"):
        return {"index": index, "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    return {"index": index, "dtype": type(value).__name__, "shape": None, "value": value
            if isinstance(value, (int, float, bool)) or value is None else str(value)}


@click.command()
@click.argument("source", metavar="BUNDLE|REF")
@click.option("--program", metavar="NAME", help="Program to run (needed with --inputs when there are several).")
@click.option("--device", type=DEVICE, metavar="DEV", help="Device to run on (default: cuda:0 if available, else cpu).")
@click.option("--inputs", "inputs_file", metavar="FILE.pt", type=click.Path(dir_okay=False),
              help="Inputs: a tuple of tensors saved with torch.save (read with weights_only=True).")
@click.option("--output", "output_file", metavar="FILE.pt", type=click.Path(dir_okay=False),
              help="Write the outputs (a tuple of tensors) here, atomically.")
@click.option("--samples", is_flag=True, help="Run the golden samples and print max abs/rel error per output.")
@click.option("--import", "imports", multiple=True, metavar="MODULE", help=_IMPORT_HELP)
@click.option("--load-library", "libraries", multiple=True, metavar="PATH.so", help=_LIBRARY_HELP)
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB", help=_SIGNATURE_HELP)
@click.option("--trust-pickle", is_flag=True, help="Allow programs whose files hold pickled data.")
@click.option("--trust-native", is_flag=True, help=_NATIVE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def run(app: App, source: str, program: str | None, device: Device | None, inputs_file: str | None,
        output_file: str | None, samples: bool, imports: tuple[str, ...], libraries: tuple[str, ...],
        pubkeys: tuple[str, ...], trust_pickle: bool, trust_native: bool, as_json: bool) -> None:
    """Verify, load and run a bundle on this machine.

    \b
    --inputs FILE.pt [--output FILE.pt]   run one program on your inputs
    --samples                             self-test on the golden samples

    Inputs are checked against the signature before the graph runs (exit 4 naming the input,
    dim and allowed range). Exit 1 when a sample is outside tolerance. AOTInductor variants run
    only when a trusted key signed the bundle or with --trust-native; the first load of a program
    no trusted key signed is deserialized in a limited subprocess first (PT2REG_SANDBOX=off
    skips it), exit 5 if that crashes or runs out of memory or time.
    """
    from ..errors import UsageError
    from ..runtime.loader import open_source_for_load
    from ..runtime.sandbox import SandboxConfig

    if not inputs_file and not samples:
        raise UsageError("nothing to run", hint="pass --inputs FILE.pt or --samples")
    if output_file and not inputs_file:
        raise UsageError("--output needs --inputs")
    # a cold run fetches the weights while the checks below and torch's deserialization run
    sandbox = SandboxConfig.from_env(app.settings.cache_dir, imports=imports, libraries=libraries)
    src = open_source_for_load(source, app.registry, sandbox, require_signature=pubkeys)
    try:
        program, value = _prechecks(src, program, inputs_file, samples, as_json)
        _run_loaded(app, src, program, value, output_file, samples, device, imports, libraries, pubkeys,
                    trust_pickle, trust_native, as_json)
    finally:
        if src.pending is not None:
            src.pending.abort()  # a run that failed before the load settled it: stop, leave no file


def _prechecks(src: MaterializedBundle, program: str | None, inputs_file: str | None, samples: bool,
               as_json: bool) -> tuple[str | None, Any]:
    """The program to run and the inputs read, refused from the manifest alone (exit 2 or 4,
    exit 1 for golden samples the signature refuses) before anything is loaded."""
    from ..errors import UsageError

    names = list(src.manifest.programs)
    if program is not None and program not in names:
        raise UsageError(f"bundle has no program {program!r}; programs: {', '.join(names)}")
    if inputs_file and program is None:
        if len(names) != 1:
            raise UsageError(f"the bundle has programs {', '.join(names)}", hint="pass --program NAME")
        program = names[0]
    value = None
    if inputs_file:
        from ..runtime.loader import precheck_inputs
        from ..runtime.torchrt import load_inputs_file

        value = load_inputs_file(inputs_file)
        precheck_inputs(src.manifest.programs[program], value)  # the manifest suffices: before the load
    if samples:
        _precheck_samples(src, program, as_json)
    return program, value


def _run_loaded(app: App, src: MaterializedBundle, program: str | None, value: Any, output_file: str | None,
                samples: bool, device: Device | None, imports: tuple[str, ...], libraries: tuple[str, ...],
                pubkeys: tuple[str, ...], trust_pickle: bool, trust_native: bool, as_json: bool) -> None:
    """``run``'s body once the bundle is open (its weights perhaps still arriving): the one
    load path, ``registry.load``, then the program or the samples."""
    from ..errors import RegistryError
    from ..runtime.loader import load, save_outputs

    bundle = load(src, device=device, imports=imports, libraries=libraries, require_signature=pubkeys,
                  programs=[program] if program else None, trust_pickle=trust_pickle, trust_native=trust_native,
                  registry=app.registry, status=status)
    doc: dict[str, Any] = {"digest": src.digest, "device": str(bundle.device),
                           "variants": {n: bundle[n].variant.id for n in bundle},
                           "variant_reasons": {n: bundle.report.choices[n][1] for n in bundle},
                           "trusted_signers": list(bundle.source.trusted_signers),
                           "native_code": [f for f in _native_notes(bundle.report) if f["program"] in bundle]}
    if value is not None:
        outputs = bundle[program].run(value)  # type: ignore[index]
        if output_file:
            save_outputs(output_file, outputs)
        doc["program"] = program
        doc["outputs"] = [_describe_output(i, o) for i, o in enumerate(outputs)]
        doc["output_file"] = output_file
    results = bundle.run_samples() if samples else []
    if samples:
        doc["samples"] = [r.to_json() for r in results]
        doc["ok"] = all(r.ok for r in results)
    if as_json:
        emit_json(doc)
    else:
        _print_run(doc, results)
    if samples and not results:
        warn("the bundle has no golden samples for the selected program(s)")
    bad = [r for r in results if not r.ok]
    if bad:
        raise RegistryError(f"{len(bad)} of {len(results)} sample(s) failed, first {bad[0].name}: "
                            + (bad[0].error or "outputs outside tolerance"))


def _precheck_samples(src: MaterializedBundle, program: str | None, as_json: bool) -> None:
    """Golden samples whose inputs the manifest already refuses: reported (exit 1) before any
    program is loaded, as ``run --samples`` would after loading it."""
    from ..errors import InputValidationError, RegistryError
    from ..runtime.loader import SampleResult, precheck_inputs
    from ..runtime.samples import read_sample

    bad, count = [], 0
    for s in src.manifest.samples:
        if program is not None and s.program != program:
            continue
        count += 1
        inputs, _ = read_sample(src.member_file(s.member), list(s.inputs), list(s.outputs),
                                label=f"{src.label or src.digest}: {s.member}")
        try:
            precheck_inputs(src.manifest.programs[s.program], tuple(inputs))
        except InputValidationError as exc:
            bad.append(SampleResult(s.name, s.program, "-", False, (), s.rtol, s.atol,
                                    f"sample inputs rejected: {exc.one_line()}"))
    if not bad:
        return
    doc = {"digest": src.digest, "device": None, "variants": {}, "loaded": False,
           "samples": [r.to_json() for r in bad], "ok": False}
    if as_json:
        emit_json(doc)
    else:
        _print_run({**doc, "device": "- (not loaded)"}, bad)
    raise RegistryError(f"{len(bad)} of {count} sample(s) failed before loading, first {bad[0].name}: "
                        f"{bad[0].error}")


def _print_run(doc: dict[str, Any], results: list[Any]) -> None:
    from rich.table import Table

    out = _console()
    out.print(esc(f"{doc['digest']} on {doc['device']}: " + ", ".join(f"{n} -> {v}" for n, v in doc["variants"].items())))
    for note in doc.get("native_code", []):
        out.print(clean(f"note: {note['message']}" + (f"; {note['fix']}" if note.get("fix") else "")), markup=False)
    if "outputs" in doc:
        table = Table(title=f"outputs of {esc(doc['program'])}", title_justify="left", box=None, pad_edge=False,
                      header_style="bold")
        for col in ("#", "dtype", "shape"):
            table.add_column(col)
        for o in doc["outputs"]:
            table.add_row(str(o["index"]), esc(o["dtype"]), esc(o["shape"] if o["shape"] is not None else f"= {o['value']}"))
        out.print(table)
        if doc.get("output_file"):
            out.print(f"wrote {esc(doc['output_file'])}")
    if results:
        table = Table(title="samples", title_justify="left", box=None, pad_edge=False, header_style="bold")
        for col in ("sample", "program", "variant", "output", "max abs", "max rel", "tolerance", ""):
            table.add_column(col)
        for r in results:
            if r.error:
                table.add_row(esc(r.name), esc(r.program), esc(r.variant), "-", "-", "-",
                              f"rtol {r.rtol:g} atol {r.atol:g}", f"[red]{esc(r.error)}[/red]")
            for o in r.outputs:  # the tolerance of each output (widened where a GPU is involved)
                tol = f"rtol {o.get('rtol', r.rtol):g} atol {o.get('atol', r.atol):g}"
                table.add_row(esc(r.name), esc(r.program), esc(r.variant), esc(o["output"]),
                              _num(o.get("max_abs")), _num(o.get("max_rel")), tol,
                              "[green]ok[/green]" if o["ok"] else
                              f"[red]FAIL[/red] {esc(o.get('detail', ''))}".rstrip())
        out.print(table)


def _num(v: Any) -> str:
    return "-" if v is None else f"{v:.3g}"


COMMANDS = [target, verify, run]
