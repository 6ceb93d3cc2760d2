"""``pt2reg bundle`` and ``pt2reg inspect``."""
from __future__ import annotations

import click

from ..constants import UNNAMED_PROGRAM_HINT
from ._core import App, emit_json, parse_key_values, pass_app, warn
from .render import clean

__all__ = ["bundle", "inspect"]


def _program_arg(text: str) -> tuple[str | None, str]:
    name, sep, path = text.partition("=")
    if sep and name and "/" not in name and not name.endswith(".pt2"):
        return name, path
    return None, text


@click.command()
@click.argument("programs", nargs=-1, required=True, metavar="PROGRAM...")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Bundle file to write (.pt2b). Written atomically.")
@click.option("--sample", "samples", multiple=True, metavar="NAME=INPUTS.pt",
              help="Golden sample inputs for program NAME (a torch.save'd tuple of tensors); "
                   "outputs are computed now and stored with the inputs (repeatable). NAME is the program's "
                   "name in the bundle: \"model\" for a PATH.pt2 given without NAME= (--sample model=x.pt).")
@click.option("--meta", "meta", multiple=True, metavar="KEY=VALUE", help="Free-form metadata (repeatable).")
@click.option("--dim", "dims", multiple=True, metavar="PROGRAM:SYMBOL=NAME",
              help="Name a dynamic dim: SYMBOL as inspect shows it (s31) or INPUT.D (tokens.0); "
                   "carried to other programs' inputs at the same position and range (repeatable). "
                   "PROGRAM is \"model\" for a PATH.pt2 given without NAME=, and may be left out "
                   "(SYMBOL=NAME) when the bundle has one program.")
@click.option("--rtol", type=float, default=None, help="Relative tolerance for samples (default 1e-4).")
@click.option("--atol", type=float, default=None, help="Absolute tolerance for samples (default 1e-5).")
@click.option("--torch-requirement", metavar="SPEC",
              help="Runtime torch requirement (PEP 440, e.g. '>=2.12,<3'); default: >= the oldest torch that reads "
                   "every program (its window, from what the program uses: pt2reg inspect shows it).")
@click.option("--device-type", "device_types", multiple=True, metavar="TYPE",
              help="Restrict the device types the bundle supports (cpu, cuda, ...; repeatable).")
@click.option("--import", "imports", multiple=True, metavar="MODULE",
              help="Import a module that registers custom ops (needed only to compute samples).")
@click.option("--load-library", "libraries", multiple=True, metavar="PATH.so",
              help="Load a compiled custom-op library (needed only to compute samples).")
@click.option("--trust-pickle", is_flag=True,
              help="Allow unpickling this file's pickled weights/constants to compute samples.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_app
def bundle(app: App, programs: tuple[str, ...], out: str, samples: tuple[str, ...], meta: tuple[str, ...],
           dims: tuple[str, ...],
           rtol: float | None, atol: float | None, torch_requirement: str | None,
           device_types: tuple[str, ...], imports: tuple[str, ...], libraries: tuple[str, ...],
           trust_pickle: bool, as_json: bool) -> None:
    """Package .pt2 programs into one immutable, content-addressed bundle.

    \b
    PROGRAM is PATH.pt2 (named "model", the name torch.export.save gives a program, or the
    archive's own names) or NAME=PATH.pt2. --sample and --dim name programs this way:
      pt2reg bundle m.pt2 --sample model=x.pt --dim model:x.0=batch -o m.pt2b
    Give an AOTInductor package under the same NAME as its portable program to add it as a
    target-specific variant:  encoder=enc.pt2 encoder=enc_cpu_aoti.pt2

    Signatures, Dim ranges, custom ops and baked devices are read from the serialized graph, so
    custom ops need not be importable here (except to compute --sample outputs).

    \b
    A .pt2 file does not keep your Dim names; give them back with --dim:
      --dim encoder:s31=batch --dim encoder:tokens.1=seq
    A name given to one program's input dim also names the other programs' input dim at the
    same position (input i, dim d) when its range is the same (printed as a note).

    Each program checked here is remembered in the home's cache (cache/vetted-programs), so a
    push or load of this bundle on this machine does not check it again.
    """
    from ..bundler import DEFAULT_ATOL, DEFAULT_RTOL, ProgramInput, SampleInput, build_bundle
    from ..client.provenance import build_info
    from ..pt2.verdicts import verdicts_dir

    inputs = [ProgramInput(*_program_arg(p)) for p in programs]
    sample_inputs = []
    for s in samples:
        name, sep, path = s.partition("=")
        if not sep or not name or not path:
            raise click.BadParameter(f"expected NAME=INPUTS.pt, got {s!r} ({UNNAMED_PROGRAM_HINT})",
                                     param_hint="--sample")
        sample_inputs.append(SampleInput(name, path))
    from ..format.dim_names import parse_dim_option

    dim_names: dict[str | None, dict[str, str]] = {}
    for d in dims:
        prog, symbol, dim_name = parse_dim_option(d)
        if dim_names.setdefault(prog, {}).get(symbol, dim_name) != dim_name:
            raise click.BadParameter(f"{prog + ':' if prog else ''}{symbol} named twice", param_hint="--dim")
        dim_names[prog][symbol] = dim_name
    if imports or libraries:
        from ..runtime.torchrt import import_modules, load_libraries

        load_libraries(libraries)
        import_modules(imports)
    result = build_bundle(out, inputs, samples=sample_inputs, metadata=parse_key_values(meta, "--meta"),
                          rtol=DEFAULT_RTOL if rtol is None else rtol,
                          atol=DEFAULT_ATOL if atol is None else atol,
                          torch_requirement=torch_requirement, device_types=device_types or None,
                          build_info=build_info(), trust_pickle=trust_pickle, dim_names=dim_names,
                          # the home's cache, where push and load look (no database is opened)
                          vetted_dir=verdicts_dir(app.settings.cache_dir),
                          schema_memo=app.settings.cache_dir / "op-schemas")
    if as_json:
        emit_json({"path": str(result.path), "digest": result.digest, "warnings": list(result.warnings),
                   "notes": list(result.notes),
                   # the warnings group them per source line; here every op, in program order
                   "baked_devices": {n: [b.to_json() for b in p.baked_devices]
                                     for n, p in result.manifest.programs.items()},
                   "size": result.path.stat().st_size})
        return
    for w in result.warnings:
        warn(w)
    for n in result.notes:
        click.echo(f"note: {clean(n)}", err=True)
    click.echo(f"{result.path} {result.digest}")


@click.command()
@click.argument("target", metavar="BUNDLE|REF")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def inspect(app: App, target: str, as_json: bool) -> None:
    """Show a bundle's programs, signatures with Dim ranges, required ops and warnings.

    A local bundle file is verified member by member (exit 5 on any mismatch); a REF is read
    from the registry's metadata without downloading blobs.
    """
    from .render import print_bundle
    from .views import bundle_view, inspect_source

    manifest, extra = inspect_source(target, lambda: app.registry)
    if as_json:
        emit_json(bundle_view(manifest, **extra))
    else:
        print_bundle(manifest, extra.get("ref") or extra.get("path"))


COMMANDS = [bundle, inspect]
