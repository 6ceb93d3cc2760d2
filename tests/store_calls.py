"""Store calls spelled the short way in tests: ``publish(store, name, digest, ...)``.

``VersionStore.publish`` takes one ``PublishRequest`` (the content) and the call's own
arguments (who, the blob check, audit details); tests that write versions straight into a store
pass both in one list, as ``publish`` took them before the request value existed.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from registry.store.records import PublishRequest, VersionRecord

__all__ = ["publish"]

#: the keyword arguments of the call itself, not of the content
_CALL = ("actor", "host", "missing_blobs", "audit_details", "identity")


def publish(store: Any, name: str, digest: str, manifest_json: str, size: int,
            blobs: Iterable[tuple[str, int]] = (), **kwargs: Any) -> tuple[VersionRecord, bool]:
    call = {k: kwargs.pop(k) for k in _CALL if k in kwargs}
    return store.publish(PublishRequest(name, digest, manifest_json, size, blobs, **kwargs), **call)
