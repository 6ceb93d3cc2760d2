"""``pt2reg materialize URI DEST``: the entrypoint of a KServe ``ClusterStorageContainer``
(KServe runs ``<entrypoint> <src-uri> <dest-path>`` in the storage initializer).

``URI`` is ``pt2reg:///NAME@REF`` (no host: the configured registry, ``PT2REG_URL`` or the
local one), a plain ``NAME@REF`` (the same), ``pt2reg://HOST[:PORT]/NAME@REF`` (plain HTTP)
/ ``pt2regs://HOST[:PORT]/NAME@REF`` (HTTPS) naming the registry, or
``oci://HOST/REPO@sha256:<hex>``: an artifact ``pt2reg oci push`` wrote to an OCI registry
(its login from the docker/podman credential files, never ``PT2REG_TOKEN``). A URI naming a registry other
than the configured one is refused (exit 2) unless ``PT2REG_ALLOWED_REGISTRIES`` lists it, and
then only the login saved for it is sent: ``PT2REG_TOKEN`` goes to the configured registry only
(``Settings.registry_for``). The ref of a URI is always a ref, never a file. Every check runs before DEST is
touched: digests (each blob is hashed as it arrives), signatures (``--require-signature``, the
trust policy), the target (``verify``), the native-code trust rule for the Triton layout. The
result is built in a directory beside DEST and moved into it only when complete, so a refused
or failed run leaves DEST as it was.
"""
from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..errors import UsageError
from ..oci.reference import OciReference, looks_like_oci
from ..refs import Ref

if TYPE_CHECKING:
    from ..client.api import Registry
    from ..client.sources import MaterializedBundle
    from ..runtime.target import Target

__all__ = ["LAYOUTS", "parse_uri", "materialize_uri", "write_layout", "MaterializeResult"]

LAYOUTS = ("triton", "bundle", "files")
_SCHEMES = {"pt2reg": "http", "pt2regs": "https"}


def parse_uri(uri: str) -> tuple[str | None, str]:
    """(server base URL, or None for the configured registry, ref); an ``oci://`` URI is
    (None, the URI), pinned by digest (``materialize_uri`` reads it from its OCI registry)."""
    if "://" not in uri:
        return None, uri
    if looks_like_oci(uri):
        ref = OciReference.parse(uri)
        if not ref.pinned:
            raise UsageError(f"model URI {uri!r} names a tag, which can move",
                             hint="pin it: oci://HOST/REPO@sha256:<hex> (`pt2reg oci push` prints it)")
        return None, uri
    parts = urlsplit(uri)
    if parts.scheme in _SCHEMES and not parts.netloc and not parts.query and not parts.fragment:
        ref = parts.path.lstrip("/")  # pt2reg:///NAME@REF: the configured registry
        if "@" not in ref:
            raise UsageError(f"model URI {uri!r} names no version", hint="pt2reg:///NAME@REF (REF: a version "
                             "number, an alias or sha256:HEX)")
        Ref.parse(ref)
        return None, ref
    if parts.scheme not in _SCHEMES or not parts.hostname or parts.query or parts.fragment \
            or parts.username or parts.password:
        raise UsageError(f"invalid model URI {uri!r}",
                         hint="use pt2reg://HOST[:PORT]/NAME@REF (pt2regs:// for HTTPS) or NAME@REF")
    try:
        parts.port  # noqa: B018 (raises on a port that is not one)
    except ValueError:
        raise UsageError(f"invalid model URI {uri!r}: bad port", hint="pt2reg://HOST[:PORT]/NAME@REF") from None
    ref = parts.path.lstrip("/")
    if not ref:
        raise UsageError(f"model URI {uri!r} names no model", hint="pt2reg://HOST[:PORT]/NAME@REF")
    if "@" not in ref:  # a storage URI pins what it serves: no silent "latest"
        raise UsageError(f"model URI {uri!r} names no version", hint="pt2reg://HOST[:PORT]/NAME@REF "
                         "(REF: a version number, an alias or sha256:HEX)")
    Ref.parse(ref)  # NAME@REF only (no '..', no %-escapes, nothing after the ref)
    return f"{_SCHEMES[parts.scheme]}://{parts.netloc}", ref


@dataclass(frozen=True)
class MaterializeResult:
    dest: Path
    layout: str
    ref: str
    digest: str
    files: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"dest": str(self.dest), "layout": self.layout, "ref": self.ref, "digest": self.digest,
                "files": list(self.files)}


def _move_into(staged: Path, dest: Path) -> list[str]:
    dest.mkdir(parents=True, exist_ok=True)
    clash = [p.name for p in staged.iterdir() if (dest / p.name).exists()]
    if clash:
        from ..errors import ConflictError

        raise ConflictError(f"{dest / clash[0]} already exists", hint="materialize into an empty directory")
    names = sorted(p.name for p in staged.iterdir())
    for name in names:
        os.replace(staged / name, dest / name)
    return names


def _check_dest(dest: Path, layout: str) -> None:
    if layout not in LAYOUTS:
        raise UsageError(f"--layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if dest.is_symlink():  # the layout would be written wherever the link points
        raise UsageError(f"{dest} is a symlink", hint="give the real directory")
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"{dest} is not a directory")


def materialize_uri(registry: Registry, ref: str, dest: str | os.PathLike, *, layout: str = "triton",
                    require_signature: Sequence[str] = (), trust_native: bool = False,
                    target: Target | None = None, model_name: str | None = None,
                    max_batch_size: int = 0) -> MaterializeResult:
    """Fetch ``ref`` from ``registry`` (verified), check it, and write ``layout`` into ``dest``."""
    from ..client.sources import open_source

    dest = Path(dest)
    _check_dest(dest, layout)
    if looks_like_oci(ref):   # an OCI artifact (parse_uri refused a tag)
        from ..client.oci import pull_to_file

        artifact = registry.oci_open(OciReference.parse(ref), require_signature=require_signature)
        src = artifact.source
        write = functools.partial(pull_to_file, artifact)
    else:   # the ref of a URI is a ref, whatever the working directory holds: never a file
        src = open_source(Ref.parse(ref), registry=registry, require_signature=require_signature)

        def write(out: Path) -> object:
            return registry.pull(ref, out, require_signature=require_signature)
    return write_layout(src, dest, layout, write_bundle=write, trust_native=trust_native, target=target,
                        model_name=model_name, max_batch_size=max_batch_size, shown=ref)


def write_layout(src: MaterializedBundle, dest: str | os.PathLike, layout: str, *,
                 write_bundle: Callable[[Path], object], trust_native: bool = False, target: Target | None = None,
                 model_name: str | None = None, max_batch_size: int = 0, shown: str = "") -> MaterializeResult:
    """Check a verified bundle (``verify`` against ``target``, the native-code rule) and write
    ``layout`` into ``dest``: built beside it and moved in only when complete.
    ``write_bundle(path)`` writes the bundle file (layout ``bundle``)."""
    from ..runtime.loader import verify_bundle
    from .triton import export_triton

    dest = Path(dest)
    _check_dest(dest, layout)
    parent = dest.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pt2reg-", dir=parent))
    try:
        if layout == "triton":
            export_triton(src, staged, model_name=model_name, max_batch_size=max_batch_size,
                          trust_native=trust_native, target=target)
        else:
            verify_bundle(src, target=target, trust_native=trust_native).raise_for_status()
            if layout == "bundle":
                name = (src.name or "model").rsplit("/", 1)[-1]
                write_bundle(staged / f"{name}.pt2b")
            else:
                for m in src.manifest.members:
                    out = staged / m.path
                    out.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src.member_file(m.path), out)
                (staged / "manifest.json").write_bytes(src.manifest.canonical)
        names = _move_into(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    label = f"{src.name}@{src.version}" if src.name else shown
    return MaterializeResult(dest, layout, label, src.digest, tuple(names))
