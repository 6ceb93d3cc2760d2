"""``pt2reg compile``, ``pt2reg export-triton`` and ``pt2reg materialize``: hand-off to serving
(``registry.serving``)."""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from ._core import DEVICE, App, emit_json, pass_app
from .render import clean

if TYPE_CHECKING:
    from ..runtime.device import Device

__all__ = ["compile_cmd", "export_triton", "materialize"]

_SIGNATURE_HELP = "Require a valid signature by this public key (repeatable); a bundle it signed may serve native code."
_NATIVE_HELP = "Allow AOTInductor variants (native code) of a bundle no trusted key signed."


def _triton_options(f: Any) -> Any:
    """The options export-triton and materialize share: the Triton model and the checks."""
    for option in reversed((
            click.option("--model-name", metavar="N", help="Triton model name (default: the model's last path part)."),
            click.option("--max-batch-size", default=0, show_default=True, type=int,
                         help="Triton max_batch_size; > 0 makes each tensor's first (dynamic) dim the batch dim."),
            click.option("--target", "target_file", metavar="FILE.json", type=click.Path(dir_okay=False),
                         help="Verify against this machine description instead of this machine."),
            click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB", help=_SIGNATURE_HELP),
            click.option("--trust-native", is_flag=True, help=_NATIVE_HELP),
            click.option("--json", "as_json", is_flag=True, help="Print the result as JSON."))):
        f = option(f)
    return f


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f} MiB"


@click.command("compile")
@click.argument("ref", metavar="REF")
@click.option("--program", "programs", multiple=True, metavar="NAME", help="Compile only this program (repeatable).")
@click.option("--device", type=DEVICE, default="cpu", show_default=True, metavar="cpu|cuda[:N]", help="Device to compile for.")
@click.option("--name", metavar="NAME", help="Publish under this model name (default: REF's model).")
@click.option("--alias", "aliases", multiple=True, metavar="ALIAS", help="Point ALIAS at the new version (repeatable).")
@click.option("--sign", "sign_key", metavar="KEY", help="Sign the new version with this private key.")
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB", help=_SIGNATURE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_app
def compile_cmd(app: App, ref: str, programs: tuple[str, ...], device: Device, name: str | None,
                aliases: tuple[str, ...], sign_key: str | None, pubkeys: tuple[str, ...], as_json: bool) -> None:
    """Compile REF's portable programs with AOTInductor for this machine and publish version N+1.

    Each program is compiled for --device (weights kept beside the library, so they dedup
    against the portable program's chunks), the new bundle is loaded choosing the new variants
    and every golden sample must pass; then it is published with --parent REF and
    `compiled.*` metadata (torch, target, options). Run it on each kind of GPU in turn to get
    one version with a variant per target. Exit 1 (nothing published) when a sample fails.
    """
    from ..serving.compile import compile_version

    result = compile_version(app.registry, ref, programs=programs, device=device, name=name, aliases=aliases,
                             sign_key=sign_key, require_signature=pubkeys)
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(clean(f"published {result.ref} ({result.digest}), parent {result.parent}"))
    for v in result.variants:
        click.echo(clean(f"  {v.program}: {v.variant} ({_mib(v.size)}, compiled in {v.seconds:.1f} s)"))
    click.echo(f"  samples: {len(result.samples)} passed on the new variants")
    click.echo(f"  store grew by {_mib(result.uploaded_bytes)} ({_mib(result.skipped_bytes)} already stored; "
               f"variant members {_mib(result.new_member_bytes)})")


@click.command("export-triton")
@click.argument("source", metavar="BUNDLE|REF")
@click.argument("outdir", type=click.Path(file_okay=False))
@click.option("--program", "programs", multiple=True, metavar="NAME", help="Export only this program (repeatable).")
@_triton_options
@pass_app
def export_triton(app: App, source: str, outdir: str, model_name: str | None, programs: tuple[str, ...],
                  max_batch_size: int, target_file: str | None, pubkeys: tuple[str, ...], trust_native: bool,
                  as_json: bool) -> None:
    """Write a Triton model repository (PyTorch backend, platform torch_aoti) to OUTDIR.

    \b
    OUTDIR/<model>/config.pbtxt
    OUTDIR/<model>/<version>/model.pt2            (CPU variant)
    OUTDIR/<model>/<version>/model.sm_90.pt2      (one per CUDA compute capability)

    Verifies first; exit 4 when a program has no AOTInductor variant (or one the backend cannot
    serve), 5 when native code is not allowed (trust policy, --require-signature, --trust-native).
    """
    from ..client.sources import open_source
    from ..runtime.target import Target
    from ..serving.triton import export_triton as run_export

    src = open_source(source, registry=app.registry, require_signature=pubkeys)
    result = run_export(src, outdir, model_name=model_name, programs=programs, max_batch_size=max_batch_size,
                        trust_native=trust_native, target=Target.load(target_file) if target_file else None)
    if as_json:
        emit_json(result.to_json())
        return
    for m in result.models:
        click.echo(clean(f"{outdir}/{m.name}: {m.kind}, version {result.version}, files "
                         + ", ".join(f"{f} ({v.id})" for v, f in m.files)
                         + (f"; not served: {', '.join(m.skipped)}" if m.skipped else "")))


@click.command()
@click.argument("uri", metavar="URI")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--layout", type=click.Choice(["triton", "bundle", "files"]), default="triton", show_default=True)
@_triton_options
@pass_app
def materialize(app: App, uri: str, dest: str, layout: str, model_name: str | None, max_batch_size: int,
                target_file: str | None, pubkeys: tuple[str, ...], trust_native: bool, as_json: bool) -> None:
    """Fetch URI, verify it and write it to DEST (a KServe storage-initializer entrypoint).

    URI: pt2reg:///NAME@REF or NAME@REF for the configured registry (PT2REG_URL, or the local
    one), oci://HOST/REPO@sha256:HEX for an artifact `pt2reg oci push` wrote to an OCI registry
    (its login from REGISTRY_AUTH_FILE or the docker config), or pt2reg://HOST[:PORT]/NAME@REF
    (pt2regs:// for HTTPS) naming a registry server; the token
    (PT2REG_TOKEN) goes only to the configured registry, and another host is refused (exit 2)
    unless PT2REG_ALLOWED_REGISTRIES lists it (it then gets only its own login). Digests, signatures, the target and (layout triton)
    the native-code rule are checked before DEST is written; on any refusal DEST is left as it
    was (exit 5 for a damaged blob or a missing signature).
    """
    from ..client import Registry
    from ..runtime.target import Target
    from ..serving.materialize import materialize_uri, parse_uri

    url, ref = parse_uri(uri)
    # the configured registry (no host, or its own URL), or an allowed other one with only its own login
    settings = app.settings if url is None else app.settings.registry_for(url)
    scratch = None
    from ..oci.reference import looks_like_oci

    if (settings.remote or looks_like_oci(ref)) and not (app._args[0] or os.environ.get("PT2REG_HOME")):
        scratch = tempfile.mkdtemp(prefix="pt2reg-materialize-")  # a storage initializer: a throw-away cache
        settings = dataclasses.replace(settings, home=Path(scratch))
    registry = app.registry if settings is app.settings else Registry(settings)
    try:
        result = materialize_uri(registry, ref, dest, layout=layout, require_signature=pubkeys,
                                 trust_native=trust_native, model_name=model_name, max_batch_size=max_batch_size,
                                 target=Target.load(target_file) if target_file else None)
    finally:
        if registry is not app.registry:
            registry.close()
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if as_json:
        emit_json(result.to_json())
    else:
        click.echo(clean(f"{result.ref} ({result.digest}) -> {result.dest} [{result.layout}]: "
                         + ", ".join(result.files)))


COMMANDS = [compile_cmd, export_triton, materialize]
