"""``pt2reg oci push|pull|referrers|export``: versions through the OCI registries teams run.

A version goes out as a CNCF ModelPack artifact (``registry.client.oci``): its blobs as layers
(a fine-tune sends only the tensors that changed), the bundle manifest as one more layer,
signatures and attestations as OCI referrers. It comes back only pinned by digest (``--allow-tag``
for a tag), checked against the pin, the trust policy and every blob's sha256 before anything is
written. Credentials: ``REGISTRY_AUTH_FILE``, else ``$DOCKER_CONFIG/config.json`` or
``~/.docker/config.json`` (what ``docker login``, ``podman login`` and ``skopeo login`` write).
HTTPS always, except loopback hosts, ``--insecure`` and hosts listed in ``PT2REG_OCI_INSECURE``.
"""
from __future__ import annotations

import re
import sys

import click

from ._core import App, emit_json, pass_app, transfer_progress

__all__ = ["oci"]

_INSECURE_HELP = ("Plain HTTP (no TLS) for this registry; loopback hosts (127.0.0.1, localhost) are plain HTTP "
                  "already. Also PT2REG_OCI_INSECURE=host:port,...")


def _size(text: str | None) -> int | None:
    """``10000MiB``, ``10G``, ``524288000`` -> bytes."""
    if text is None:
        return None
    from ..errors import UsageError

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"--max-layer-size {text!r} is not a size", hint="e.g. 10000MiB, 10G or a byte count")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@click.group()
def oci() -> None:
    """Push versions to OCI registries (Harbor, ECR, GHCR, distribution) as CNCF ModelPack
    artifacts, and pull them back verified.

    \b
      pt2reg oci push team/m@3 ghcr.io/acme/m:v3      # prints ghcr.io/acme/m@sha256:...
      pt2reg oci pull ghcr.io/acme/m@sha256:... -o m.pt2b
      pt2reg materialize oci://ghcr.io/acme/m@sha256:... /mnt/models
      pt2reg oci referrers ghcr.io/acme/m@sha256:... --key release.pub

    Logins come from REGISTRY_AUTH_FILE, else $DOCKER_CONFIG/config.json or ~/.docker/config.json
    (docker/podman/skopeo login write them); a login goes only to the registry it is for.
    """


@oci.command("push")
@click.argument("ref")
@click.argument("target", metavar="HOST/REPO[:TAG]")
@click.option("--insecure", is_flag=True, help=_INSECURE_HELP)
@click.option("--max-layer-size", "max_layer", metavar="SIZE",
              help="Refuse before uploading anything if a layer is larger (e.g. 10000MiB for ECR).")
@click.option("--mount-from", "mount_from", multiple=True, metavar="REPO",
              help="A repository of the same registry to mount existing blobs from (repeatable; the "
                   "repositories this registry pushed to on that host are tried too).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def push(app: App, ref: str, target: str, insecure: bool, max_layer: str | None, mount_from: tuple[str, ...],
         as_json: bool) -> None:
    """Push the version REF names to an OCI registry as a ModelPack artifact.

    Layers the repository already has are not sent, blobs another repository of the registry
    holds are mounted, the rest uploaded several at once. Prints the pinned reference
    (HOST/REPO@sha256:...), which is recorded on the version (`pt2reg show`).
    """
    from ..oci.reference import OciReference

    reg = app.registry
    where = OciReference.parse(target)
    size = reg.resolve(ref).size
    with transfer_progress(size, f"oci push {ref}", enabled=not as_json) as progress:
        result = reg.oci_push(ref, where, insecure=insecure, progress=progress, max_layer_size=_size(max_layer),
                              mount_from=mount_from)
    if as_json:
        emit_json(result.to_json())
        return
    pinned = f"{result.reference.location}@{result.manifest_digest}"
    click.echo(f"{pinned} {result.bundle_digest}")
    from ._core import info

    info(f"{result.layers} layers: {result.uploaded} uploaded ({result.uploaded_bytes} bytes), {result.mounted} "
         f"mounted, {result.present} already there; {len(result.referrers)} referrers")


@oci.command("pull")
@click.argument("source", metavar="HOST/REPO@sha256:HEX")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Bundle file to write (atomically; nothing is written when a check fails).")
@click.option("--allow-tag", is_flag=True, help="Accept HOST/REPO:TAG (a tag can move; a digest cannot).")
@click.option("--insecure", is_flag=True, help=_INSECURE_HELP)
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB",
              help="Refuse unless signed by one of these public keys (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def pull(app: App, source: str, out: str, allow_tag: bool, insecure: bool, pubkeys: tuple[str, ...],
         as_json: bool) -> None:
    """Rebuild the bundle of an OCI artifact pushed by `pt2reg oci push` (or copied by any
    OCI tool since): byte for byte the bundle `pt2reg pull` writes for that version.

    The manifest is checked against the pinned digest, the bundle manifest against its own
    digest, the trust policy and --require-signature keys before any weight is fetched, and
    every blob against its sha256 as it streams.
    """
    from ..client.oci import artifact_size
    from ..oci.reference import OciReference

    reg = app.registry
    where = OciReference.parse(source)
    # the bar needs the size first (one manifest GET, on a terminal only); a tag is refused by oci_pull
    show = not as_json and sys.stderr.isatty() and (where.pinned or allow_tag)
    size = artifact_size(where, insecure=insecure) if show else 0
    with transfer_progress(size, f"oci pull {where.location}", enabled=not as_json) as progress:
        pinned, src = reg.oci_pull(where, out, insecure=insecure, allow_tag=allow_tag, require_signature=pubkeys,
                                   progress=progress)
    if as_json:
        emit_json({"path": out, "reference": str(pinned), "name": src.name, "version": src.version,
                   "digest": src.digest, "trusted_signers": list(src.trusted_signers)})
        return
    click.echo(f"{out} {src.name}@{src.version} {src.digest}")


@oci.command("referrers")
@click.argument("source", metavar="HOST/REPO@sha256:HEX")
@click.option("--key", "keys", multiple=True, metavar="PUB",
              help="A public key to verify with, besides the trust policy's (repeatable).")
@click.option("--allow-tag", is_flag=True, help="Accept HOST/REPO:TAG.")
@click.option("--insecure", is_flag=True, help=_INSECURE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def referrers(app: App, source: str, keys: tuple[str, ...], allow_tag: bool, insecure: bool, as_json: bool) -> None:
    """List the signatures and attestations attached to an OCI artifact (the referrers API, or
    the tag schema on registries without it), each verified when its key is trusted here.

    Exit 5 when one that names a trusted key does not verify.
    """
    from ..errors import SignatureError

    pinned, found = app.registry.oci_referrers(source, insecure=insecure, allow_tag=allow_tag, keys=keys)
    if as_json:
        emit_json({"reference": str(pinned), "referrers": [r.to_json() for r in found]})
    else:
        for r in found:
            state = {True: "verified", False: "INVALID", None: "not checked"}[r.verified]
            click.echo(f"{r.kind} {r.digest} {state}: {r.detail}")
        if not found:
            click.echo("no signatures or attestations")
    bad = [r for r in found if r.verified is False]
    if bad:
        raise SignatureError(f"{len(bad)} referrer(s) of {pinned} do not verify: {bad[0].detail}",
                             hint="do not trust this artifact's signatures; ask its publisher")


@oci.command("unpack")
@click.argument("directory", type=click.Path(file_okay=False, exists=True))
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--bundle-digest", "bundle_digest", required=True, metavar="sha256:HEX",
              help="The bundle the deployment pinned (the second field `pt2reg oci push` prints; `pt2reg show`).")
@click.option("--layout", type=click.Choice(["triton", "bundle", "files"]), default="triton", show_default=True)
@click.option("--referrers-from", "referrers_from", metavar="HOST/REPO@sha256:HEX",
              help="Read the artifact's signatures from its registry (a mount carries none).")
@click.option("--insecure", is_flag=True, help=_INSECURE_HELP)
@click.option("--target", "target_file", metavar="FILE", help="Check against this target (pt2reg target --json), "
              "not this machine.")
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB",
              help="Refuse unless signed by one of these public keys (needs --referrers-from).")
@click.option("--trust-native", is_flag=True, help="Serve AOTInductor variants of an unsigned bundle.")
@click.option("--model-name", metavar="NAME", help="Triton model name (default: the model's last name part).")
@click.option("--max-batch-size", type=int, default=0, show_default=True, help="Triton max_batch_size.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def unpack(app: App, directory: str, dest: str, bundle_digest: str, layout: str, referrers_from: str | None,
           insecure: bool, target_file: str | None, pubkeys: tuple[str, ...], trust_native: bool,
           model_name: str | None, max_batch_size: int, as_json: bool) -> None:
    """Check the layers of an artifact mounted at DIRECTORY and write LAYOUT into DEST: the
    verification step before a server starts on a Kubernetes image volume (or after
    `oras pull`, which names files the same way).

    The bundle must be --bundle-digest, every blob it needs present and matching its sha256,
    the trust policy met and the bundle compatible with this machine (or --target) before DEST
    is written; on any refusal DEST is left as it was.
    """
    from ..client.oci import pull_to_file
    from ..runtime.target import Target
    from ..serving.materialize import write_layout

    artifact = app.registry.oci_open_mounted(directory, bundle_digest, referrers_from=referrers_from,
                                             insecure=insecure, require_signature=pubkeys)
    result = write_layout(artifact.source, dest, layout, write_bundle=lambda out: pull_to_file(artifact, out),
                          trust_native=trust_native, target=Target.load(target_file) if target_file else None,
                          model_name=model_name, max_batch_size=max_batch_size, shown=directory)
    if as_json:
        emit_json(result.to_json())
        return
    click.echo(f"{result.ref} ({result.digest}) -> {result.dest} [{result.layout}]: {', '.join(result.files)}")


@oci.command("export")
@click.argument("ref")
@click.argument("dest", type=click.Path(file_okay=False))
@click.option("--tag", metavar="TAG", help="Name the artifact TAG in the layout's index (skopeo copy oci:DEST:TAG).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def export(app: App, ref: str, dest: str, tag: str | None, as_json: bool) -> None:
    """Write the version REF names as an OCI image layout in DEST (a new directory), for OCI
    tools that copy layouts (skopeo copy oci:DEST:TAG docker://HOST/REPO:TAG, oras, crane).
    """
    from ..client.oci import export_layout

    plan = export_layout(app.registry, ref, dest, tag=tag)
    if as_json:
        emit_json({"path": dest, "manifest_digest": plan.manifest_digest, "digest": plan.version.digest,
                   "layers": len(plan.layers)})
        return
    click.echo(f"{dest} {plan.manifest_digest} {plan.version.digest}")


COMMANDS = [oci]
