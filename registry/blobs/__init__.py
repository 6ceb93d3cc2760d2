"""Content-addressed blob storage: a local directory or S3, behind one small interface.

    >>> from registry.blobs import open_blob_store
    >>> store = open_blob_store("file:///srv/pt2reg")          # or "s3://bucket/prefix"
    >>> store.get_file("sha256:" + "ab" * 32, "model.pt2")      # verified, atomic

Importing this package does not import boto3; ``S3BlobStore`` is loaded on first use.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .base import BlobInfo, BlobStore, ProgressFn, open_blob_store
from .local import LocalBlobStore

if TYPE_CHECKING:
    from .s3 import S3BlobStore

__all__ = ["BlobInfo", "BlobStore", "ProgressFn", "open_blob_store", "LocalBlobStore", "S3BlobStore"]


def __getattr__(name: str):
    if name == "S3BlobStore":
        from .s3 import S3BlobStore

        return S3BlobStore
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
