"""What a blob store whose blobs are not files on this machine (S3, a registry server, an OCI
registry) declares alike: network reads on ``packed.WORKERS`` threads, nothing to map or copy
in place, no packs written by this client. Each store adds whether it presigns."""
from __future__ import annotations

from .packed import WORKERS

__all__ = ["NetworkBlobs"]


class NetworkBlobs:
    """The ``BlobStore`` capabilities and answers shared by stores reached over the network."""

    #: declared capabilities (``BlobStore``): network reads, no local files
    read_workers = WORKERS
    maps_in_place = False
    writes_packs = False

    def in_place(self, digest: str, size: int | None = None) -> None:
        """None: these blobs are not files on this machine (``maps_in_place`` is False)."""
        return None

    def local_file(self, digest: str, size: int | None = None) -> None:
        """None: remote blobs are fetched, never read as local files."""
        return None
