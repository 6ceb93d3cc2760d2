"""``OciBlobStore``: the read half of the ``BlobStore`` protocol over one OCI repository, so
a pull from an OCI registry runs through the same verified, resumable, parallel fetches as a
pull from the pt2reg server (``remote.blobs.HttpBlobStore``, whose downloads this reuses).

A blob is read only if the artifact's manifest lists it as a layer (``layers``: digest ->
size, from ``modelpack.ArtifactLayout``): the size is the manifest's, never the registry's
word, and every byte is hashed against the digest as it streams (chunks of packs each against
their own digest). Writing, deleting and listing are not this store's (``oci push`` uploads
with ``OciClient.upload_blob``); they raise ``UsageError``.

``MountedLayers`` is the same for a directory of an artifact's layers as an artifact mount
(a Kubernetes image volume on CRI-O, ``podman --mount type=artifact``) or ``oras pull`` writes
them: one file per layer, named by its ``org.opencontainers.image.title`` (``sha256-<hex>``
for a blob). Every read is verified against the digest, as a local store's are.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from ..blobs.base import BlobInfo
from ..blobs.local import LocalBlobStore
from ..errors import IntegrityError, UsageError
from ..remote.blobs import HttpBlobStore, Target
from .client import OciClient

__all__ = ["OciBlobStore", "MountedLayers"]

_READ_ONLY = "an OCI artifact is read here, never written: `pt2reg oci push` uploads one"


class OciBlobStore(HttpBlobStore):
    """The layers of one artifact in ``client``'s repository."""

    def __init__(self, client: OciClient, layers: Mapping[str, int], *, transfers: int = 8) -> None:
        # OciClient has HttpClient's send() and base_url, all HttpBlobStore uses
        super().__init__(client, transfers=transfers)  # type: ignore[arg-type]
        self.url = f"{client.base_url}/v2/{client.ref.repository}"
        self._layers = dict(layers)
        self.read_workers = transfers

    def __repr__(self) -> str:
        return f"OciBlobStore({self.url!r})"

    def _size(self, digest: str) -> int:
        try:
            return self._layers[digest]
        except KeyError:
            raise IntegrityError(f"the OCI artifact lists no layer {digest} that its bundle needs",
                                 hint="the artifact is incomplete or was altered: push it again") from None

    def download_targets(self, digests: Iterable[str]) -> dict[str, Target]:
        return {d: Target(d, f"{self.url}/blobs/{d}", self._size(d)) for d in digests}

    def _head(self, digest: str) -> BlobInfo | None:
        size = self._layers.get(digest)
        return None if size is None else BlobInfo(digest, size, 0.0)

    def put_parts(self, *args: object, **kwargs: object) -> tuple[int, int]:
        raise UsageError(_READ_ONLY)

    def put_file(self, *args: object, **kwargs: object) -> bool:
        raise UsageError(_READ_ONLY)

    def put_stream(self, *args: object, **kwargs: object) -> bool:
        raise UsageError(_READ_ONLY)

    def put_bytes(self, *args: object, **kwargs: object) -> bool:
        raise UsageError(_READ_ONLY)

    def delete(self, digest: str) -> None:
        raise UsageError(_READ_ONLY)

    def list(self) -> Iterator[BlobInfo]:
        raise UsageError(_READ_ONLY)


class MountedLayers(LocalBlobStore):
    """The blob layers in ``root`` as files named ``sha256-<hex>`` (read only)."""

    #: copied into the cache (verified), never mapped from a mount another process may change
    maps_in_place = False
    writes_packs = False

    def __init__(self, root: str | Path) -> None:
        super().__init__(root)

    def __repr__(self) -> str:
        return f"MountedLayers({str(self.root)!r})"

    def _path(self, digest: str) -> Path:
        from ..refs import validate_digest
        from .modelpack import blob_title

        return self.root / blob_title(validate_digest(digest))

    def in_place(self, digest: str, size: int | None = None) -> None:
        return None   # copied into the cache (verified), never mapped from a mount another may change

    def _read_only(self, *args: object, **kwargs: object) -> bool:
        raise UsageError("mounted artifact layers are read only")

    put_file = put_stream = put_bytes = _read_only  # type: ignore[assignment]

    def put_parts(self, *args: object, **kwargs: object) -> tuple[int, int]:
        raise UsageError("mounted artifact layers are read only")

    def delete(self, digest: str) -> None:
        raise UsageError("mounted artifact layers are read only")
