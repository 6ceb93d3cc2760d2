"""A registry version as a CNCF ModelPack artifact, and back: pure values, no IO.

The OCI image manifest (``artifactType`` ``application/vnd.cncf.model.manifest.v1+json``)
has a ModelPack config (``application/vnd.cncf.model.config.v1+json``: the model's name and
version, ``format: pt2b``, its precision) and these layers, each raw (ModelPack's ``.raw``
media types: no tar, no compression; weights do not compress):

* one **bundle layer** (``pt2reg/bundle.json``, annotation ``dev.pt2reg.layer: bundle``): the
  bundle's canonical manifest text (signature, Dim ranges, custom ops, baked devices, variants,
  golden samples: everything ``verify`` decides from), the version's pack index and its build
  record. Signatures are not in it: they are OCI referrers of the artifact, so signing a
  version after it was pushed attaches a signature without changing the artifact's digest. ModelPack's config allows no extension field
  (its schema says ``additionalProperties: false``), so this is a layer;
* every **blob** the registry stores for the version (``blobs/sha256/<hex>``, annotation
  ``dev.pt2reg.layer: blob``; title ``sha256-<hex>``, the file name an artifact mount gives it): per-tensor chunks, packs of small chunks and whole members,
  named by the same sha256 here as in the registry's own store. A fine-tune shares most of
  them with its parent, and an OCI registry stores (and uploads, and mounts across
  repositories) a blob once.

The bundle is rebuilt from these byte for byte: the bundle layer's manifest must hash to the
digest it claims (``Manifest.from_bytes``), each member is its chunks (each verified by sha256),
and the OCI manifest's digest (the user's pin) covers the bundle layer's digest.

    >>> art = ArtifactLayout.parse(build_manifest(b"{}", [Layer(BUNDLE_MEDIA, "sha256:" + "a" * 64, 9,
    ...     {ROLE: ROLE_BUNDLE})], annotations={}))
    >>> art.bundle.size
    9
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from ..digests import canonical_json, digest_of_bytes
from ..errors import IntegrityError, UsageError
from ..refs import DIGEST_RE

__all__ = [
    "IMAGE_MANIFEST", "IMAGE_INDEX", "MODEL_ARTIFACT", "MODEL_CONFIG", "WEIGHT_RAW", "WEIGHT_CONFIG_RAW", "CODE_RAW",
    "DATASET_RAW", "BUNDLE_MEDIA", "EMPTY_CONFIG", "EMPTY_JSON", "SIGNATURE_ARTIFACT", "LEGACY_SIGNATURE_ARTIFACT",
    "ATTESTATION_ARTIFACT", "ROLE", "ROLE_BUNDLE", "ROLE_BLOB", "FILEPATH", "TITLE", "BUNDLE_TITLE", "blob_title", "MAX_MANIFEST_BYTES",
    "MAX_BUNDLE_LAYER_BYTES", "Layer", "Descriptor", "ArtifactLayout", "BundleLayer", "build_manifest",
    "modelpack_config", "precision_of", "blob_layer", "referrer_manifest", "parse_index",
]

IMAGE_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
IMAGE_INDEX = "application/vnd.oci.image.index.v1+json"
MODEL_ARTIFACT = "application/vnd.cncf.model.manifest.v1+json"
MODEL_CONFIG = "application/vnd.cncf.model.config.v1+json"
WEIGHT_RAW = "application/vnd.cncf.model.weight.v1.raw"
WEIGHT_CONFIG_RAW = "application/vnd.cncf.model.weight.config.v1.raw"
CODE_RAW = "application/vnd.cncf.model.code.v1.raw"
DATASET_RAW = "application/vnd.cncf.model.dataset.v1.raw"
#: the bundle layer is "a configuration file of the model weights" in ModelPack's terms
BUNDLE_MEDIA = WEIGHT_CONFIG_RAW
#: the OCI empty descriptor's content (a referrer's config)
EMPTY_CONFIG = "application/vnd.oci.empty.v1+json"
EMPTY_JSON = b"{}"
#: an OMS signature (a Sigstore bundle, as OpenSSF model-signing writes it) as a referrer
SIGNATURE_ARTIFACT = "application/vnd.dev.sigstore.bundle.v0.3+json"
#: a signature of the legacy kinds (a bare-digest ed25519/ecdsa signature entry, JSON)
LEGACY_SIGNATURE_ARTIFACT = "application/vnd.pt2reg.signature.v1+json"
#: a conformance attestation (``pt2reg attest``: verify and the golden samples run on a target)
ATTESTATION_ARTIFACT = "application/vnd.pt2reg.attestation.v1+json"

ROLE = "dev.pt2reg.layer"
ROLE_BUNDLE = "bundle"
ROLE_BLOB = "blob"
FILEPATH = "org.cncf.model.filepath"
#: the file name an artifact mount (podman, CRI-O image volumes) or ``oras pull`` gives a layer
TITLE = "org.opencontainers.image.title"
#: the bundle layer's file name in such a directory (``pt2reg oci unpack``)
BUNDLE_TITLE = "pt2reg-bundle.json"
FILE_METADATA = "org.cncf.model.file.metadata+json"
UNTESTED = "org.cncf.model.file.mediatype.untested"
BUNDLE_PATH = "pt2reg/bundle.json"
ENVELOPE_TYPE = "application/vnd.pt2reg.oci-bundle.v1+json"
#: a manifest read from a registry is refused above this (the distribution spec's 4 MiB)
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
#: the bundle layer is refused above this (a 10,000-tensor program's is ~3 MiB)
MAX_BUNDLE_LAYER_BYTES = 256 * 1024 * 1024
_FLOAT_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
                "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "int8": "int8", "uint8": "uint8", "int4": "int4"}


@dataclass(frozen=True)
class Descriptor:
    """An OCI content descriptor: media type, ``sha256:<hex>`` digest and size."""

    media_type: str
    digest: str
    size: int
    annotations: Mapping[str, str] = field(default_factory=dict)
    artifact_type: str | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        return out

    @classmethod
    def from_json(cls, raw: Any, where: str) -> Descriptor:
        if not isinstance(raw, dict):
            raise _bad(f"{where} is not a descriptor")
        media, digest, size = raw.get("mediaType"), raw.get("digest"), raw.get("size")
        if not isinstance(media, str) or not isinstance(digest, str) or not DIGEST_RE.match(digest) \
                or type(size) is not int or size < 0:
            raise _bad(f"{where} is not a sha256 descriptor with a media type and a size")
        notes = raw.get("annotations") or {}
        if not isinstance(notes, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in notes.items()):
            raise _bad(f"{where}: annotations must map strings to strings")
        kind = raw.get("artifactType")
        return cls(media, digest, size, notes, kind if isinstance(kind, str) else None)


#: a layer is a descriptor (the name says which list it is in)
Layer = Descriptor


def _bad(message: str) -> IntegrityError:
    return IntegrityError(f"the OCI artifact is not a pt2reg model: {message}",
                          hint="push it with `pt2reg oci push`; check the reference's digest")


def blob_layer(digest: str, size: int, role: str, created: datetime) -> Layer:
    """The layer of one stored blob, its ModelPack media type by what it holds (``role``: the
    role of the member whose bytes it is; packs and chunks of programs hold weights)."""
    media = {"sample": DATASET_RAW, "aoti": CODE_RAW, "library": CODE_RAW}.get(role, WEIGHT_RAW)
    path = "blobs/sha256/" + digest.split(":", 1)[1]
    meta = {"name": path, "mode": 0o444, "uid": 0, "gid": 0, "size": size, "mtime": _rfc3339(created),
            "typeflag": 48}
    return Layer(media, digest, size, {ROLE: ROLE_BLOB, FILEPATH: path, TITLE: blob_title(digest), UNTESTED: "false",
                                       FILE_METADATA: json.dumps(meta, sort_keys=True, separators=(",", ":"))})


def blob_title(digest: str) -> str:
    """A blob layer's file name in a mounted artifact: ``sha256-<hex>`` (flat: mounts make no folders)."""
    return digest.replace(":", "-", 1)


def _rfc3339(when: datetime) -> str:
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def precision_of(dtypes: Iterable[str]) -> str | None:
    """ModelPack's ``precision`` for the weights' dtypes: one name (``fp32``, ``bf16``...),
    ``mixed`` for several floating kinds, None for none."""
    names = {_FLOAT_NAMES[d.removeprefix("torch.")] for d in dtypes if d.removeprefix("torch.") in _FLOAT_NAMES}
    if not names:
        return None
    return names.pop() if len(names) == 1 else "mixed"


def modelpack_config(*, name: str, version: int, created: datetime, created_by: str | None,
                     precision: str | None, layers: list[Layer]) -> bytes:
    """The ModelPack config JSON (canonical: the same version gives the same bytes)."""
    descriptor: dict[str, Any] = {"name": name, "version": str(version), "createdAt": _rfc3339(created)}
    if created_by:
        descriptor["authors"] = [created_by]
    config: dict[str, Any] = {"format": "pt2b"}
    if precision:
        config["precision"] = precision
    return canonical_json({"descriptor": descriptor, "config": config,
                           "modelfs": {"type": "layers", "diffIds": [layer.digest for layer in layers]}})


def build_manifest(config: bytes, layers: list[Layer], *, annotations: Mapping[str, str]) -> bytes:
    """The OCI image manifest of a model artifact (canonical JSON bytes)."""
    return canonical_json({
        "schemaVersion": 2, "mediaType": IMAGE_MANIFEST, "artifactType": MODEL_ARTIFACT,
        "config": Descriptor(MODEL_CONFIG, digest_of_bytes(config), len(config)).to_json(),
        "layers": [layer.to_json() for layer in layers], "annotations": dict(annotations)})


def referrer_manifest(subject: Descriptor, artifact_type: str, layer: Descriptor,
                      annotations: Mapping[str, str]) -> bytes:
    """An OCI 1.1 referrer: an artifact manifest whose ``subject`` is the model's manifest, the
    empty config, and ``layer`` (a signature or an attestation)."""
    return canonical_json({
        "schemaVersion": 2, "mediaType": IMAGE_MANIFEST, "artifactType": artifact_type,
        "config": Descriptor(EMPTY_CONFIG, digest_of_bytes(EMPTY_JSON), len(EMPTY_JSON)).to_json(),
        "layers": [layer.to_json()], "subject": Descriptor(subject.media_type, subject.digest, subject.size).to_json(),
        "annotations": dict(annotations)})


def parse_index(data: bytes, where: str) -> list[Descriptor]:
    """The manifests an OCI image index lists (the referrers API's answer, or its tag fallback)."""
    raw = _json(data, where)
    items = raw.get("manifests", [])
    if not isinstance(items, list):
        raise _bad(f"{where}: 'manifests' is not a list")
    return [Descriptor.from_json(d, f"{where} manifests[{i}]") for i, d in enumerate(items)]


def _json(data: bytes, where: str) -> dict[str, Any]:
    try:
        raw = json.loads(data)
    except ValueError as exc:
        raise _bad(f"{where} is not JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise _bad(f"{where} is not a JSON object")
    return raw


@dataclass(frozen=True)
class ArtifactLayout:
    """A model artifact's OCI manifest, read: the config, the bundle layer and every layer by
    digest (what may be fetched from the repository for it)."""

    config: Descriptor
    bundle: Descriptor
    layers: Mapping[str, Descriptor]
    annotations: Mapping[str, str]

    @classmethod
    def parse(cls, data: bytes) -> ArtifactLayout:
        """Check an OCI manifest is a pt2reg model artifact (``IntegrityError`` saying why not)."""
        if len(data) > MAX_MANIFEST_BYTES:
            raise _bad(f"its manifest has {len(data)} bytes (more than {MAX_MANIFEST_BYTES})")
        raw = _json(data, "its manifest")
        if raw.get("schemaVersion") != 2 or raw.get("mediaType") not in (IMAGE_MANIFEST, None):
            raise _bad(f"its manifest is a {raw.get('mediaType')!r}, not an OCI image manifest")
        config = Descriptor.from_json(raw.get("config"), "its config")
        kind = raw.get("artifactType") or config.media_type
        if kind != MODEL_ARTIFACT and config.media_type != MODEL_CONFIG:
            raise _bad(f"its artifact type is {kind!r}, not a ModelPack model ({MODEL_ARTIFACT})")
        items = raw.get("layers")
        if not isinstance(items, list):
            raise _bad("it has no layers")
        layers = [Descriptor.from_json(d, f"layer {i}") for i, d in enumerate(items)]
        bundles = [d for d in layers if d.annotations.get(ROLE) == ROLE_BUNDLE]
        if len(bundles) != 1:
            raise _bad(f"it has {len(bundles)} pt2reg bundle layers (annotation {ROLE}={ROLE_BUNDLE}), not one")
        by_digest: dict[str, Descriptor] = {}
        for d in layers:
            if by_digest.setdefault(d.digest, d).size != d.size:
                raise _bad(f"layer {d.digest} is listed with two sizes")
        notes = raw.get("annotations") or {}
        if not isinstance(notes, dict):
            raise _bad("its annotations are not an object")
        return cls(config, bundles[0], by_digest, {str(k): str(v) for k, v in notes.items()})


@dataclass(frozen=True)
class BundleLayer:
    """The bundle layer's content: what a bundle is rebuilt and checked from."""

    digest: str                    # the pt2reg digest (of the canonical manifest)
    name: str
    version: int
    manifest: str                  # canonical manifest JSON text
    packs: str | None              # the version's pack index JSON text
    build: dict[str, Any] | None

    def to_bytes(self) -> bytes:
        return canonical_json({"mediaType": ENVELOPE_TYPE, "digest": self.digest, "name": self.name,
                               "version": self.version, "manifest": self.manifest, "packs": self.packs,
                               "build": self.build})

    @classmethod
    def from_bytes(cls, data: bytes) -> BundleLayer:
        """Parse the layer (its form only: the manifest is checked against its digest by the caller)."""
        raw = _json(data, "its bundle layer")
        if raw.get("mediaType") != ENVELOPE_TYPE:
            raise _bad(f"its bundle layer is a {raw.get('mediaType')!r}, not {ENVELOPE_TYPE}")
        digest, name, version = raw.get("digest"), raw.get("name"), raw.get("version")
        manifest, packs, build = raw.get("manifest"), raw.get("packs"), raw.get("build")
        if not isinstance(digest, str) or not DIGEST_RE.match(digest) or not isinstance(name, str) \
                or type(version) is not int or version < 1 or not isinstance(manifest, str) \
                or not (packs is None or isinstance(packs, str)) or not (build is None or isinstance(build, dict)):
            raise _bad("its bundle layer lacks a field or has one of the wrong type")
        from ..refs import validate_name

        try:
            validate_name(name)
        except UsageError as exc:
            raise _bad(f"its bundle layer names an invalid model ({exc.message})") from None
        return cls(digest, name, version, manifest, packs, build)
