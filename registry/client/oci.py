"""OCI delivery: a version pushed to an OCI registry as a CNCF ModelPack artifact, and pulled,
checked and rebuilt from one (``pt2reg oci push|pull|referrers``, ``oci://`` sources).

**Push** (``push_version``): the version's stored blobs (per-tensor chunks, packs, whole
members: exactly what this registry stores, ``format.manifest.stored_blobs``) become layers,
with the bundle layer and the ModelPack config (``oci.modelpack``). Each layer is asked for
first (``HEAD``: an unchanged chunk of a fine-tune is not sent again), then mounted from
another repository of the same registry this machine pushed to before (``?mount=&from=``),
and only then uploaded, several at once, hashed as read. The manifest goes last (by tag, or by
digest), then one referrer per signature and attestation. The push is recorded on the version
(``oci_artifacts``: ``show`` lists it). An interrupted push leaves blobs a registry's own gc
reclaims and no manifest.

**Pull** (``open_artifact``): only a digest pin unless ``allow_tag``; the manifest is checked
against the pin, the bundle layer against the manifest, the bundle manifest against its own
digest; the trust policy is enforced (the model the bundle layer names, and rules whose ``oci``
globs match the repository the user named) before any weight is fetched; each blob is fetched
only if a layer lists it, every byte hashed while it streams (``oci.blobs.OciBlobStore``), into
this machine's cache. ``pull_to_file`` then writes the bundle, byte for byte the one
``pt2reg pull`` writes for the version.
"""
from __future__ import annotations

import functools
import io
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..blobs.base import ProgressFn, locked_progress
from ..digests import canonical_json, digest_of_bytes
from ..errors import IntegrityError, NotFoundError, SignatureError, UsageError
from ..format.bundle import write_bundle
from ..format.manifest import Manifest, stored_blobs
from ..format.packs import PackIndex
from ..oci.client import READ_PIECE, OciClient
from ..oci.modelpack import (
    ATTESTATION_ARTIFACT,
    BUNDLE_MEDIA,
    BUNDLE_PATH,
    BUNDLE_TITLE,
    EMPTY_JSON,
    FILEPATH,
    LEGACY_SIGNATURE_ARTIFACT,
    MAX_BUNDLE_LAYER_BYTES,
    ROLE,
    ROLE_BUNDLE,
    SIGNATURE_ARTIFACT,
    TITLE,
    ArtifactLayout,
    BundleLayer,
    Descriptor,
    blob_layer,
    build_manifest,
    modelpack_config,
    precision_of,
    referrer_manifest,
)
from ..oci.reference import OciReference
from ..parallel import run_calls
from .sources import MaterializedBundle

if TYPE_CHECKING:
    from ..store.records import VersionRecord
    from .api import Registry
    from .ports import BlobStore

__all__ = ["OciPushResult", "OciArtifact", "OciReferrer", "ArtifactPlan", "plan_artifact", "export_layout", "push_version", "open_artifact", "pull_to_file",
           "list_referrers", "open_mounted", "describe_artifact", "pull_direct", "artifact_size", "ENV_INSECURE", "insecure_hosts", "TRANSFERS"]

#: layers moved at once
TRANSFERS = 8
#: hosts (comma-separated, with their ports) reached over plain HTTP without ``--insecure``
ENV_INSECURE = "PT2REG_OCI_INSECURE"
#: a referrer's layer (a signature or an attestation) is refused above this
MAX_REFERRER_BYTES = 1 << 20


def insecure_hosts() -> frozenset[str]:
    import os

    return frozenset(h.strip().lower() for h in os.environ.get(ENV_INSECURE, "").split(",") if h.strip())


def client_for(ref: OciReference, insecure: bool) -> OciClient:
    return OciClient(ref, insecure=insecure or ref.host.lower() in insecure_hosts())


@dataclass(frozen=True)
class OciPushResult:
    reference: OciReference              # pinned by the manifest's digest (and the tag, if one was given)
    manifest_digest: str
    bundle_digest: str
    layers: int
    uploaded: int                        # layers sent
    mounted: int                         # layers mounted from another repository
    present: int                         # layers the repository had already
    uploaded_bytes: int
    referrers: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"reference": str(self.reference), "manifest_digest": self.manifest_digest,
                "digest": self.bundle_digest, "layers": self.layers, "uploaded": self.uploaded,
                "mounted": self.mounted, "present": self.present, "uploaded_bytes": self.uploaded_bytes,
                "referrers": list(self.referrers)}


@dataclass(frozen=True)
class OciArtifact:
    """An artifact read from an OCI registry (or its mounted layers): its members verified files
    in the cache (``source``), its pinned reference and what the bundle layer carried."""

    reference: OciReference | None       # pinned by digest (None: a mount read without its registry)
    source: MaterializedBundle
    build: dict[str, Any] | None
    layout: ArtifactLayout | None = field(default=None, repr=False)


@dataclass(frozen=True)
class OciReferrer:
    """A signature or attestation found through the referrers API (or its tag fallback), and
    whether it verified against a trusted key (None: no trusted key is its signer's)."""

    digest: str
    kind: str                            # "signature" | "attestation" | the artifact type
    key_id: str | None
    verified: bool | None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"digest": self.digest, "kind": self.kind, "key_id": self.key_id, "verified": self.verified,
                "detail": self.detail}


# -- push -------------------------------------------------------------------------------------
def _roles(manifest: Manifest) -> dict[str, str]:
    """blob digest -> the role of the member whose bytes it is (packs: programs')."""
    out: dict[str, str] = {}
    for m in manifest.members:
        if m.chunks:
            for sha, _size in m.chunks:
                out.setdefault("sha256:" + sha, m.role)
        else:
            out.setdefault(m.digest, m.role)
    return out


def _store_source(blobs: BlobStore, digest: str) -> Callable[[int, int], Iterator[bytes]]:
    def read(offset: int, n: int) -> Iterator[bytes]:
        f = blobs.open(digest)
        try:
            if offset:
                try:
                    f.seek(offset)
                except (AttributeError, OSError, io.UnsupportedOperation):
                    left = offset
                    while left:
                        skipped = f.read(min(READ_PIECE, left))
                        if not skipped:
                            break
                        left -= len(skipped)
            left = n
            while left:
                data = f.read(min(READ_PIECE, left))
                if not data:
                    break
                left -= len(data)
                yield data
        finally:
            f.close()
    return read


def _bytes_source(data: bytes) -> Callable[[int, int], Iterator[bytes]]:
    def read(offset: int, n: int) -> Iterator[bytes]:
        for at in range(offset, offset + n, READ_PIECE):
            yield data[at:min(at + READ_PIECE, offset + n)]
    return read


class _Uploads:
    """Counts of a push's layers, kept from several threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.uploaded = self.mounted = self.present = self.bytes = 0


def _send_layer(client: OciClient, digest: str, size: int, source: Callable[[int, int], Iterator[bytes]],
                mount_from: Sequence[str], counts: _Uploads, progress: ProgressFn | None) -> None:
    if client.blob_size(digest) == size:
        with counts.lock:
            counts.present += 1
        if progress is not None:
            progress(size)
        return
    session = None
    for repo in mount_from:
        session = client.mount_blob(digest, repo)
        if session is None:
            with counts.lock:
                counts.mounted += 1
            if progress is not None:
                progress(size)
            return
        break   # the registry opened an upload instead: upload into it
    client.upload_blob(digest, size, source, session=session, progress=progress)
    with counts.lock:
        counts.uploaded += 1
        counts.bytes += size


def _bundle_layer(registry: Registry, version: VersionRecord) -> BundleLayer:
    assert version.manifest_json is not None
    return BundleLayer(version.digest, version.name, version.number, version.manifest_json, version.packs_json,
                       registry.meta.build_info(version.name, version.number))


@dataclass(frozen=True)
class ArtifactPlan:
    """A version as an OCI artifact, before anything is sent: the manifest's bytes and where
    each blob it lists (layers and config) is read from."""

    version: VersionRecord
    manifest: bytes
    manifest_digest: str
    layers: tuple[Descriptor, ...]
    #: digest -> (size, reads ``size`` bytes from an offset): every blob the manifest lists
    sources: dict[str, tuple[int, Callable[[int, int], Iterator[bytes]]]]


def plan_artifact(registry: Registry, ref: str, *, max_layer_size: int | None = None) -> ArtifactPlan:
    """The ModelPack artifact of the version ``ref`` names (deterministic: the same version
    gives the same manifest digest)."""
    version = registry.resolve(ref)
    if version.manifest_json is None:
        version = registry.meta.resolve(_pinned(version))
    text = version.manifest_json or ""
    manifest = Manifest.from_bytes(text.encode("utf-8"), version.digest)
    if manifest.digest != version.digest:
        raise IntegrityError(f"{version.ref}: stored manifest does not match its digest {version.digest}",
                             hint="the metadata database was altered")
    bundle_bytes = _bundle_layer(registry, version).to_bytes()
    created = version.created_at or datetime.fromtimestamp(0, timezone.utc)
    manifest_blob = digest_of_bytes(text.encode("utf-8"))
    blobs = sorted((d, n) for d, n in stored_blobs(text, version.packs_json) if d != manifest_blob)
    if max_layer_size is not None:
        too_big = [(d, n) for d, n in blobs if n > max_layer_size]
        if too_big or len(bundle_bytes) > max_layer_size:
            what = f"blob {too_big[0][0]} has {too_big[0][1]} bytes" if too_big else \
                f"the bundle layer has {len(bundle_bytes)} bytes"
            raise UsageError(f"{version.ref} does not fit the layer limit: {what}, more than --max-layer-size "
                             f"{max_layer_size}", hint="raise the limit to the registry's own (ECR: 10000MiB)")
    roles = _roles(manifest)
    bundle_desc = Descriptor(BUNDLE_MEDIA, digest_of_bytes(bundle_bytes), len(bundle_bytes),
                             {ROLE: ROLE_BUNDLE, FILEPATH: BUNDLE_PATH, TITLE: BUNDLE_TITLE,
                              "org.cncf.model.file.mediatype.untested": "false"})
    layers = [bundle_desc] + [blob_layer(d, n, roles.get(d, "program"), created) for d, n in blobs]
    dtypes = [dt for p in manifest.programs.values() for dt in p.dtypes]
    config = modelpack_config(name=version.name, version=version.number, created=created,
                              created_by=version.created_by, precision=precision_of(dtypes), layers=layers)
    annotations = {"org.opencontainers.image.title": version.name,
                   "org.opencontainers.image.version": str(version.number),
                   "org.opencontainers.image.created": _rfc3339(created),
                   "dev.pt2reg.model": version.name, "dev.pt2reg.version": str(version.number),
                   "dev.pt2reg.digest": version.digest}
    oci_manifest = build_manifest(config, layers, annotations=annotations)
    sources: dict[str, tuple[int, Callable[[int, int], Iterator[bytes]]]] = {
        bundle_desc.digest: (len(bundle_bytes), _bytes_source(bundle_bytes)),
        digest_of_bytes(config): (len(config), _bytes_source(config))}
    for d, n in blobs:
        sources.setdefault(d, (n, _store_source(registry.blobs, d)))
    return ArtifactPlan(version, oci_manifest, digest_of_bytes(oci_manifest), tuple(layers), sources)


def push_version(registry: Registry, ref: str, target: OciReference, *, insecure: bool = False,
                 progress: ProgressFn | None = None, max_layer_size: int | None = None,
                 mount_from: Sequence[str] = (), transfers: int = TRANSFERS) -> OciPushResult:
    """Push the version ``ref`` names to ``target`` (``HOST/REPO[:TAG]``; a digest in it must be
    the one the artifact gets). See the module's docstring."""
    from ..config import actor, hostname

    plan = plan_artifact(registry, ref, max_layer_size=max_layer_size)
    version = plan.version
    if target.digest is not None and target.digest != plan.manifest_digest:
        raise UsageError(f"{target} pins {target.digest}, but {version.ref} is {plan.manifest_digest} as an OCI "
                         "artifact", hint="push to HOST/REPO[:TAG]; the digest is printed after the push")
    candidates = list(mount_from) + [r for r in registry.meta.oci_repositories(target.host)
                                     if r != target.repository and r not in mount_from]
    counts = _Uploads()
    progress = locked_progress(progress)
    with client_for(target, insecure) as client:
        order = sorted(plan.sources.items(), key=lambda kv: -kv[1][0])   # the largest first
        run_calls([functools.partial(_send_layer, client, d, n, src, candidates[:1], counts, progress)
                   for d, (n, src) in order], max(1, transfers))
        client.put_manifest(target.tag or plan.manifest_digest, plan.manifest)
        subject = Descriptor("application/vnd.oci.image.manifest.v1+json", plan.manifest_digest, len(plan.manifest))
        referrers = _push_referrers(registry, client, version, subject)
    pinned = OciReference(target.host, target.repository, target.tag, plan.manifest_digest)
    registry.meta.record_oci_artifact(version.name, version.number, location=target.location, tag=target.tag,
                                      manifest_digest=plan.manifest_digest, actor=actor(), host=hostname())
    return OciPushResult(pinned, plan.manifest_digest, version.digest, len(plan.layers), counts.uploaded,
                         counts.mounted, counts.present, counts.bytes, tuple(referrers))


def export_layout(registry: Registry, ref: str, dest: str | Path, *, tag: str | None = None) -> ArtifactPlan:
    """Write the version ``ref`` names as an OCI image layout at ``dest`` (a new or empty
    directory: ``oci-layout``, ``index.json``, ``blobs/sha256/...``), each blob verified as it
    is copied: what ``skopeo copy oci:DEST:TAG docker://...`` and other OCI tools read."""
    import hashlib
    import json
    import os
    import shutil
    import tempfile

    from ..atomic import atomic_write

    plan = plan_artifact(registry, ref)
    dest = Path(dest)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise UsageError(f"{dest} is not an empty directory", hint="export into a new directory")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{dest.name}.pt2reg-", dir=dest.parent))
    try:
        blobs_dir = staged / "blobs" / "sha256"
        blobs_dir.mkdir(parents=True)
        for digest, (size, source) in list(plan.sources.items()) + [
                (plan.manifest_digest, (len(plan.manifest), _bytes_source(plan.manifest)))]:
            h = hashlib.sha256()
            with atomic_write(blobs_dir / digest.split(":", 1)[1], fsync=False) as out:
                for data in source(0, size):
                    h.update(data)
                    out.write(data)
                if "sha256:" + h.hexdigest() != digest or out.tell() != size:
                    raise IntegrityError(f"blob {digest} does not match its digest in this registry's store",
                                         hint="the store is damaged: run `pt2reg audit --verify`")
        desc = {"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": plan.manifest_digest,
                "size": len(plan.manifest), "artifactType": "application/vnd.cncf.model.manifest.v1+json"}
        if tag:
            OciReference.parse(f"h.io/r:{tag}")
            desc["annotations"] = {"org.opencontainers.image.ref.name": tag}
        (staged / "oci-layout").write_text(json.dumps({"imageLayoutVersion": "1.0.0"}))
        (staged / "index.json").write_bytes(canonical_json({"schemaVersion": 2,
                                                            "mediaType": "application/vnd.oci.image.index.v1+json",
                                                            "manifests": [desc]}))
        if dest.exists():
            dest.rmdir()
        os.replace(staged, dest)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    return plan


def _pinned(version: VersionRecord) -> Any:
    from ..refs import Ref

    return Ref(version.name, version=version.number)


def _rfc3339(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _referrer_payloads(registry: Registry, version: VersionRecord) -> list[tuple[str, bytes, dict[str, str]]]:
    """(artifact type, layer bytes, annotations) of each signature and attestation of ``version``."""
    from ..format.signing import OMS

    out = []
    base = {"dev.pt2reg.model": version.name, "dev.pt2reg.version": str(version.number),
            "dev.pt2reg.digest": version.digest}
    for i, s in enumerate(registry.meta.signatures(version.name, version.number)):
        entry = s.to_json()
        notes = {**base, "dev.pt2reg.key_id": s.key_id, "dev.pt2reg.algorithm": s.algorithm,
                 "dev.pt2reg.order": f"{i:06d}"}
        if s.created_at is not None:
            notes["org.opencontainers.image.created"] = _rfc3339(s.created_at)
        if s.algorithm == OMS:
            out.append((SIGNATURE_ARTIFACT, str(entry["signature"]).encode("utf-8"), notes))
        else:
            out.append((LEGACY_SIGNATURE_ARTIFACT, canonical_json(entry), notes))
    from ..access.policy import attestation_statement

    for a in registry.meta.attestations(version.name, version.number):
        statement = attestation_statement(digest=a.digest, label=a.label, passed=a.passed, device=a.device,
                                          target=a.target, results=a.results, error=a.error)
        doc = {"statement": statement, "key_id": a.key_id, "signature": a.signature,
               "created_by": a.created_by, "created_at": _rfc3339(a.created_at)}
        notes = {**base, "dev.pt2reg.label": a.label, "dev.pt2reg.passed": str(a.passed).lower()}
        if a.key_id:
            notes["dev.pt2reg.key_id"] = a.key_id
        out.append((ATTESTATION_ARTIFACT, canonical_json(doc), notes))
    return out


def _push_referrers(registry: Registry, client: OciClient, version: VersionRecord, subject: Descriptor) -> list[str]:
    payloads = _referrer_payloads(registry, version)
    if not payloads:
        return []
    empty = digest_of_bytes(EMPTY_JSON)
    if client.blob_size(empty) != len(EMPTY_JSON):
        client.upload_blob(empty, len(EMPTY_JSON), _bytes_source(EMPTY_JSON))
    out = []
    for kind, data, notes in payloads:
        d = digest_of_bytes(data)
        if client.blob_size(d) != len(data):
            client.upload_blob(d, len(data), _bytes_source(data))
        body = referrer_manifest(subject, kind, Descriptor(kind, d, len(data), {"dev.pt2reg.layer": "referrer"}), notes)
        out.append(client.add_referrer(subject.digest, body, kind, notes))
    return out


# -- pull -------------------------------------------------------------------------------------
def _read_artifact(client: OciClient, ref: OciReference) -> tuple[OciReference, ArtifactLayout, BundleLayer,
                                                                    Manifest, PackIndex | None]:
    data, _media = client.get_manifest(ref.reference)
    pinned = ref.with_digest(digest_of_bytes(data)) if ref.digest is None else ref
    layout = ArtifactLayout.parse(data)
    layer = BundleLayer.from_bytes(client.read_blob(layout.bundle.digest, layout.bundle.size, MAX_BUNDLE_LAYER_BYTES))
    manifest = Manifest.from_bytes(layer.manifest.encode("utf-8"), layer.digest)
    if manifest.digest != layer.digest:
        raise IntegrityError(f"{pinned}: the bundle layer's manifest hashes to {manifest.digest}, not the {layer.digest} "
                             "it claims", hint="the artifact was altered: do not use it")
    packs = PackIndex.from_stored(layer.packs, str(pinned)) if layer.packs else None
    needed = stored_blobs(layer.manifest, packs)
    needed.discard((digest_of_bytes(layer.manifest.encode("utf-8")), len(layer.manifest.encode("utf-8"))))
    for d, n in sorted(needed):
        listed = layout.layers.get(d)
        if listed is None or listed.size != n:
            raise IntegrityError(f"{pinned}: the bundle needs blob {d} ({n} bytes), which the artifact "
                                 + ("does not list" if listed is None else f"lists with {listed.size} bytes"),
                                 hint="the artifact is incomplete or was altered: push it again")
    return pinned, layout, layer, manifest, packs


def _signatures(client: OciClient, pinned: OciReference, layer: BundleLayer) -> list[dict[str, Any]]:
    """The signatures attached to the artifact as referrers, each well formed for its bundle,
    in the order the registry recorded them (what ``pt2reg pull`` writes into a bundle)."""
    import json

    from ..format.signing import OMS, check_signature_entries

    found: list[tuple[str, str, dict[str, Any]]] = []
    seen: set[tuple[str, str]] = set()
    for desc, kind, data, notes in _referrer_layers(client, pinned, (SIGNATURE_ARTIFACT, LEGACY_SIGNATURE_ARTIFACT)):
        try:
            if kind == SIGNATURE_ARTIFACT:
                entry: Any = {"algorithm": OMS, "key_id": notes.get("dev.pt2reg.key_id", ""), "digest": layer.digest,
                              "signature": data.decode("utf-8")}
            else:
                entry = json.loads(data)
            (entry,) = check_signature_entries(layer.digest, [entry])
        except (SignatureError, ValueError, UnicodeDecodeError):
            continue   # not a signature of this bundle: it counts for nothing, as a wrong one would
        if (entry["key_id"], entry["signature"]) not in seen:
            seen.add((entry["key_id"], entry["signature"]))
            found.append((str(notes.get("dev.pt2reg.order", "")), desc.digest, entry))
    return [entry for _order, _digest, entry in sorted(found, key=lambda f: (f[0], f[1]))]


def _referrer_layers(client: OciClient, pinned: OciReference,
                     kinds: Sequence[str]) -> Iterator[tuple[Descriptor, str, bytes, dict[str, str]]]:
    """(referrer descriptor, artifact type, its one layer's verified bytes, annotations) of each
    referrer of ``pinned`` of one of ``kinds``."""
    import json

    assert pinned.digest is not None
    for desc in client.referrers(pinned.digest):
        data, _ = client.get_manifest(desc.digest)
        try:
            raw = json.loads(data)
            kind = raw.get("artifactType") or ""
            subject = raw.get("subject") or {}
            layers = raw.get("layers") or []
            if kind not in kinds or subject.get("digest") != pinned.digest or len(layers) != 1:
                continue
            layer = Descriptor.from_json(layers[0], "the referrer's layer")
        except (ValueError, AttributeError, IntegrityError):
            continue
        notes = raw.get("annotations") if isinstance(raw.get("annotations"), dict) else {}
        body = client.read_blob(layer.digest, layer.size, MAX_REFERRER_BYTES)
        yield Descriptor(desc.media_type, desc.digest, desc.size, {str(k): str(v) for k, v in notes.items()}, kind), \
            kind, body, notes


def describe_artifact(registry: Registry, ref: OciReference, *, insecure: bool = False, allow_tag: bool = False,
                      require_signature: Sequence[str] = ()) -> tuple[OciReference, MaterializedBundle]:
    """The artifact's bundle from its manifest and bundle layer alone (checked, trusted), no
    weight fetched: what ``verify --target FILE oci://...`` and ``inspect`` need. A tag is
    read with ``allow_tag`` only; the pinned reference comes back."""
    _refuse_tag(ref, allow_tag)
    with client_for(ref, insecure) as client:
        pinned, _layout, _layer, _packs, src = _trusted_artifact(registry, client, ref, require_signature)
    return pinned, src


def _refuse_tag(ref: OciReference, allow_tag: bool) -> None:
    """A tag can move: only a digest pin is read, unless the caller allows a tag."""
    if not ref.pinned and not allow_tag:
        raise UsageError(f"{ref} names a tag, which can move: a pull pins a digest",
                         hint=f"use {ref.host}/{ref.repository}@sha256:<hex> (`pt2reg oci push` prints it), "
                              "or pass --allow-tag")


def _trusted_artifact(registry: Registry, client: OciClient, ref: OciReference, require_signature: Sequence[str]
                      ) -> tuple[OciReference, ArtifactLayout, BundleLayer, PackIndex | None, MaterializedBundle]:
    """The artifact's manifest and bundle layer checked (``_read_artifact``), its signatures
    from the referrers, the trust policy and ``require_signature`` enforced; no weight fetched."""
    pinned, layout, layer, manifest, packs = _read_artifact(client, ref)
    src = MaterializedBundle(manifest, {}, _signatures(client, pinned, layer), label=str(pinned), name=layer.name,
                             version=layer.version, location=pinned.location)
    return pinned, layout, layer, packs, registry.enforce_trust(src, require_signature=require_signature,
                                                                 pinned=True)


def artifact_size(ref: OciReference, *, insecure: bool = False) -> int:
    """The bytes an artifact's layers hold (its manifest only: what a progress bar needs first)."""
    with client_for(ref, insecure) as client:
        data, _ = client.get_manifest(ref.reference)
    return sum(d.size for d in ArtifactLayout.parse(data).layers.values())


def open_artifact(registry: Registry, ref: OciReference, *, insecure: bool = False, allow_tag: bool = False,
                  require_signature: Sequence[str] = (), progress: ProgressFn | None = None) -> OciArtifact:
    """The artifact ``ref`` pins, checked and trusted, its members verified files in the cache."""
    from ..oci.blobs import OciBlobStore
    from .fetch import fetch_members

    _refuse_tag(ref, allow_tag)
    with client_for(ref, insecure) as client:
        pinned, layout, layer, packs, src = _trusted_artifact(registry, client, ref, require_signature)
        store = OciBlobStore(client, {d: desc.size for d, desc in layout.layers.items()})
        from ..parallel import gc_held

        with gc_held():
            files = fetch_members(src.manifest, store, registry.cache, progress, index=packs)
    import dataclasses

    return OciArtifact(pinned, dataclasses.replace(src, files=files), layer.build, layout)


def open_mounted(registry: Registry, directory: str | Path, bundle_digest: str, *,
                 referrers_from: OciReference | None = None, insecure: bool = False,
                 require_signature: Sequence[str] = (), progress: ProgressFn | None = None) -> OciArtifact:
    """The artifact whose layers lie in ``directory`` as an artifact mount (a Kubernetes image
    volume) or ``oras pull`` writes them (``oci.blobs.MountedLayers``), checked like
    ``open_artifact``: it must be the bundle ``bundle_digest`` (what the deployment pinned),
    every blob it needs is there at its size and hashes to its digest, and the trust policy
    holds. A mount has no signatures; ``referrers_from`` (the artifact's pinned reference) reads
    them from the registry's referrers."""
    from ..oci.blobs import MountedLayers
    from ..oci.modelpack import blob_title
    from ..refs import validate_digest
    from .fetch import fetch_members

    validate_digest(bundle_digest)
    root = Path(directory)
    path = root / BUNDLE_TITLE
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_BUNDLE_LAYER_BYTES + 1)
    except OSError as exc:
        raise NotFoundError(f"{path}: {exc.strerror or exc} (is {root} the artifact's mount?)", what="file",
                            name=str(path)) from None
    if len(data) > MAX_BUNDLE_LAYER_BYTES:
        raise IntegrityError(f"{path} is larger than {MAX_BUNDLE_LAYER_BYTES} bytes: not a bundle layer")
    layer = BundleLayer.from_bytes(data)
    if layer.digest != bundle_digest:
        raise IntegrityError(f"{root} holds bundle {layer.digest} ({layer.name}@{layer.version}), not the "
                             f"{bundle_digest} pinned", hint="mount the artifact the deployment names")
    manifest = Manifest.from_bytes(layer.manifest.encode("utf-8"), layer.digest)
    if manifest.digest != layer.digest:
        raise IntegrityError(f"{path}: its manifest hashes to {manifest.digest}, not {layer.digest}",
                             hint="the mounted artifact was altered: do not use it")
    packs = PackIndex.from_stored(layer.packs, str(path)) if layer.packs else None
    needed = stored_blobs(layer.manifest, packs)
    needed.discard((digest_of_bytes(layer.manifest.encode("utf-8")), len(layer.manifest.encode("utf-8"))))
    for d, n in sorted(needed):
        layer_file = root / blob_title(d)
        if not layer_file.is_file() or layer_file.stat().st_size != n:
            raise IntegrityError(f"{root} lacks layer {layer_file.name} ({n} bytes) that the bundle needs",
                                 hint="the mount is incomplete or altered")
    sigs: list[dict[str, Any]] = []
    if referrers_from is not None:
        if not referrers_from.pinned:
            raise UsageError(f"--referrers-from {referrers_from} must be pinned by digest")
        with client_for(referrers_from, insecure) as client:
            sigs = _signatures(client, referrers_from, layer)
    src = MaterializedBundle(manifest, {}, sigs, label=str(root), name=layer.name, version=layer.version,
                             location=referrers_from.location if referrers_from is not None else None)
    src = registry.enforce_trust(src, require_signature=require_signature, pinned=True)
    from ..parallel import gc_held

    with gc_held():
        files = fetch_members(manifest, MountedLayers(root), registry.cache, progress, index=packs)
    import dataclasses

    return OciArtifact(referrers_from, dataclasses.replace(src, files=files), layer.build)


def pull_to_file(artifact: OciArtifact, out: str | Path) -> Path:
    """Write ``artifact``'s bundle at ``out`` (atomically): the bytes ``pt2reg pull`` writes."""
    src = artifact.source
    write_bundle(out, src.manifest, src.member_sources(), build=artifact.build, signatures=src.signatures or None)
    return Path(out)


def pull_direct(registry: Registry, ref: OciReference, out: str | Path, *, insecure: bool = False,
                allow_tag: bool = False, require_signature: Sequence[str] = (),
                progress: ProgressFn | None = None) -> tuple[OciReference, MaterializedBundle]:
    """``open_artifact`` + ``pull_to_file`` in one pass: every chunk fetched straight into its
    place in the bundle file (hashed against its sha256 as it streams), not into the cache
    first and copied (a 2 GiB pull wrote and hashed every byte twice). Members this machine has
    cached already are copied from the cache. The same checks, in the same order, before any
    weight; the same bytes. Returns the pinned reference and the (trusted) bundle, no files."""
    from ..format.bundle import write_bundle_filled
    from ..oci.blobs import OciBlobStore
    from ..parallel import gc_held
    from .pull import fill_members

    _refuse_tag(ref, allow_tag)
    with client_for(ref, insecure) as client:
        pinned, layout, layer, packs, src = _trusted_artifact(registry, client, ref, require_signature)
        store = OciBlobStore(client, {d: desc.size for d, desc in layout.layers.items()})
        fill = fill_members(src.manifest, store, registry.cache, packs, locked_progress(progress))
        with gc_held():
            write_bundle_filled(out, src.manifest, fill, build=layer.build, signatures=src.signatures or None)
    return pinned, src


def list_referrers(registry: Registry, ref: OciReference, *, insecure: bool = False, allow_tag: bool = False,
                   keys: Sequence[str] = ()) -> tuple[OciReference, list[OciReferrer]]:
    """The signatures and attestations of an artifact, each verified against the trust
    policy's keys and ``keys`` (public key files) when its signer is one of them."""
    from ..access.policy import attestation_digest
    from ..format.keys import key_id_of, public_key_from_pem
    from ..format.signing import OMS, check_signatures, read_public_key_file, valid_signer

    _refuse_tag(ref, allow_tag)
    known = dict(registry.trust_policy.keys())
    for path in keys:
        key = public_key_from_pem(read_public_key_file(path).encode("ascii", "replace"), f"key {path}")
        known[key_id_of(key)] = key
    out: list[OciReferrer] = []
    with client_for(ref, insecure) as client:
        pinned, _layout, layer, _manifest, _packs = _read_artifact(client, ref)
        kinds = (SIGNATURE_ARTIFACT, LEGACY_SIGNATURE_ARTIFACT, ATTESTATION_ARTIFACT)
        for desc, kind, data, notes in _referrer_layers(client, pinned, kinds):
            if kind == ATTESTATION_ARTIFACT:
                out.append(_attestation(desc, data, layer.digest, known, attestation_digest, valid_signer))
                continue
            key_id = notes.get("dev.pt2reg.key_id")
            if kind == SIGNATURE_ARTIFACT:
                entry = {"algorithm": OMS, "key_id": key_id, "digest": layer.digest,
                         "signature": data.decode("utf-8", "replace")}
            else:
                import json

                try:
                    entry = json.loads(data)
                except ValueError:
                    out.append(OciReferrer(desc.digest, "signature", key_id, False, "not JSON"))
                    continue
            checks = check_signatures(layer.digest, [entry], known, name=layer.name, version=layer.version)
            if not checks:
                out.append(OciReferrer(desc.digest, "signature", key_id, None, "signed by a key not trusted here"))
            else:
                c = checks[0]
                out.append(OciReferrer(desc.digest, "signature", c.key_id, c.valid,
                                       c.problem or f"{c.kind} signature of {c.model or layer.name}@"
                                                    f"{c.version or layer.version}"))
    return pinned, out


def _attestation(desc: Descriptor, data: bytes, digest: str, known: dict[str, Any], attestation_digest: Any,
                 valid_signer: Any) -> OciReferrer:
    import json

    try:
        doc = json.loads(data)
        statement, key_id, signature = doc["statement"], doc.get("key_id"), doc.get("signature")
        label, passed = statement["label"], statement["passed"]
    except (ValueError, KeyError, TypeError):
        return OciReferrer(desc.digest, "attestation", None, False, "not an attestation")
    if statement.get("digest") != digest:
        return OciReferrer(desc.digest, "attestation", key_id, False, "it attests another bundle")
    what = f"{label}: {'passed' if passed else 'failed'} on {statement.get('device')}"
    if not key_id or not signature:
        return OciReferrer(desc.digest, "attestation", None, None, f"unsigned ({what})")
    key = known.get(str(key_id))
    if key is None:
        return OciReferrer(desc.digest, "attestation", key_id, None, f"signed by a key not trusted here ({what})")
    from ..format.signing import LEGACY_ALGORITHMS

    why = ""
    for algorithm in LEGACY_ALGORITHMS:   # a record keeps the signature, not its algorithm: the key's decides
        signer, why = valid_signer(attestation_digest(statement), [{"key_id": key_id, "signature": signature,
                                                                    "algorithm": algorithm}], {key_id: key})
        if signer is not None:
            return OciReferrer(desc.digest, "attestation", key_id, True, what)
    return OciReferrer(desc.digest, "attestation", key_id, False, why)

