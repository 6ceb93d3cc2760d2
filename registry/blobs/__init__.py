"""Content-addressed blob storage: a local directory or S3, behind one small interface::

    from registry.blobs import open_blob_store
    store = open_blob_store("file:///srv/pt2reg")          # or "s3://bucket/prefix"
    store.get_file("sha256:" + "ab" * 32, "model.pt2")      # verified, atomic

The factory lives here, in the package face: ``base.py`` holds the interface and the helpers
every backend shares and imports no implementation. Importing this package does not import
boto3; ``S3BlobStore`` is loaded on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..errors import UsageError
from .base import BlobInfo, BlobStore, Part, ProgressFn
from .local import LocalBlobStore

if TYPE_CHECKING:
    from .s3 import S3BlobStore

__all__ = ["BlobInfo", "BlobStore", "Part", "ProgressFn", "open_blob_store", "LocalBlobStore", "S3BlobStore"]

_URL_HINT = "use file:///DIR, a directory path or s3://BUCKET/PREFIX"


def open_blob_store(url: str) -> BlobStore:
    """Open the store a URL names: ``file:///abs/dir``, a plain directory path, or ``s3://bucket/prefix``.

    >>> open_blob_store("s3://models/team-a").url
    's3://models/team-a'
    """
    if not isinstance(url, str) or not url.strip():
        raise UsageError("empty blob store URL", hint=_URL_HINT)
    if url.startswith("s3://"):
        from .s3 import S3BlobStore  # boto3 is imported only when an S3 store is used

        return S3BlobStore(url)
    if url.startswith("file://"):
        return LocalBlobStore.from_url(url)
    if "://" not in url:
        return LocalBlobStore(url)
    raise UsageError(f"unsupported blob store URL {url!r}", hint=_URL_HINT)


def __getattr__(name: str):
    if name == "S3BlobStore":
        from .s3 import S3BlobStore

        return S3BlobStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
