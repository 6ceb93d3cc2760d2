"""What a publish records beside a manifest, derived from the manifest the server verified;
and the typed manifest of a stored version (``manifest_of``), for pages and ``/v1/compat``.

A version's size, its metadata (what ``show``, the web pages and search display) and the blobs
it needs are functions of its manifest, so the server computes them from the manifest text it
checked (hashes to the digest, valid, canonical) and records nothing a client says about them.
A client may still send them (older servers need ``size``); a value that disagrees with the
manifest is refused with ``IntegrityError`` (422) naming the field, and nothing is recorded.

What a manifest does not determine stays the client's word and is recorded as such: the
publisher's ``environment``, the bundle's ``build.json`` (informational, unsigned), lineage
facts other than parents (datasets, run id, commit, code URI), the claimed ``host``.

    >>> derived = derive("team/a", digest, manifest_json, PackIndex())    # doctest: +SKIP
    >>> require_agreement("team/a", derived, size=1, metadata=None, blobs=[])   # doctest: +SKIP
    Traceback (most recent call last):
    registry.errors.IntegrityError: cannot publish team/a: field 'size' disagrees with its manifest ...
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..digests import digest_of_bytes
from ..errors import IntegrityError, ManifestError
from ..format.manifest import Manifest, recorded_facts, stored_blobs
from ..format.packs import PackIndex

__all__ = ["Derived", "derive", "require_agreement", "manifest_of"]

_SHOWN = 80   # characters of a client's value quoted in an error


@dataclass(frozen=True)
class Derived:
    """What a version records as a function of its manifest (and its pack index)."""

    manifest: Manifest
    size: int
    metadata: dict[str, Any]
    blobs: list[tuple[str, int]]


def derive(name: str, digest: str, manifest_json: str, index: PackIndex) -> Derived:
    """The version of ``manifest_json`` published as ``digest``: the text must hash to the
    digest and be a valid manifest in canonical form, as every pull checks (another spelling,
    hashing to ``digest`` as sent, would record a version no client can pull); its blobs are
    the manifest's, with the chunks ``index`` places in packs replaced by those packs."""
    text = manifest_json.encode("utf-8")
    if digest_of_bytes(text) != digest:
        raise IntegrityError(f"cannot publish {name}: field 'digest' is not its manifest's: the manifest does not "
                             f"hash to {digest}", hint="send the manifest's canonical JSON text unchanged")
    try:
        manifest = Manifest.from_bytes(text, digest)
    except ManifestError as exc:
        raise IntegrityError(f"cannot publish {name}: {exc.message}",
                             hint="send the manifest.json of a bundle (pt2reg bundle writes one)") from None
    if manifest.canonical != text:
        raise IntegrityError(f"cannot publish {name}: its manifest is not in canonical form (sorted keys, no "
                             f"spaces): as a manifest its digest is {manifest.digest}, not {digest}",
                             hint="send the manifest's canonical JSON text unchanged")
    try:
        blobs = sorted(dict(stored_blobs(manifest_json, index)).items())  # UsageError (400): an index that does not fit
        size, metadata = recorded_facts(manifest_json)
    except ManifestError:
        raise IntegrityError(f"cannot publish {name}: its manifest is not a JSON object listing "
                             f"members with sha256 and size",
                             hint="send the manifest.json of a bundle") from None
    return Derived(manifest, size, metadata, blobs)


def require_agreement(name: str, derived: Derived, *, size: int | None, metadata: Mapping[str, Any] | None,
                      blobs: list[tuple[str, int]]) -> None:
    """``IntegrityError`` naming the first field a client sent that is not what ``derived`` says
    (None / empty: not sent). ``blobs`` may name fewer blobs than the manifest needs (the
    server stores them all), but each at the size the manifest gives it."""
    if size is not None and size != derived.size:
        raise _differs(name, "size", f"{size} bytes, the manifest's members and text are {derived.size}")
    if metadata is not None and dict(metadata) != derived.metadata:
        raise _differs(name, "metadata", _first_difference(dict(metadata), derived.metadata))
    needed = dict(derived.blobs)
    for digest, n in blobs:
        if needed.get(digest) != n:
            raise _differs(name, "blobs", f"blob {digest} of {n} bytes is not one the manifest names at that size")


def _differs(name: str, field: str, detail: str) -> IntegrityError:
    return IntegrityError(f"cannot publish {name}: field {field!r} disagrees with its manifest: {detail}; "
                          f"nothing was recorded",
                          hint=f"send the manifest's own {field}, or leave {field!r} out: the server derives it")


def _first_difference(sent: dict[str, Any], manifest: dict[str, Any]) -> str:
    for key in sorted(set(sent) | set(manifest), key=str):
        if key not in manifest:
            return f"key {_quoted(key)} is not in the manifest's metadata"
        if key not in sent:
            return f"key {_quoted(key)} of the manifest's metadata is left out"
        if sent[key] != manifest[key]:
            return f"key {_quoted(key)} is {_quoted(sent[key])}, the manifest says {_quoted(manifest[key])}"
    return "it differs"  # unreachable: the two differ somewhere


def _quoted(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "..."


_MANIFESTS: OrderedDict[str, Manifest] = OrderedDict()
_MANIFESTS_KEPT = 256
_MANIFESTS_LOCK = threading.Lock()


def manifest_of(version: Any) -> Manifest:
    """A stored version's typed manifest (pages, ``/v1/compat``). A version's digest is its
    manifest's sha256, so the parsed (and schema-validated) view is kept by digest: a second
    view of the same bytes skips the validation. IntegrityError when the stored manifest does
    not hash to the version's digest (the database was altered)."""
    with _MANIFESTS_LOCK:
        cached = _MANIFESTS.get(version.digest)
        if cached is not None:
            _MANIFESTS.move_to_end(version.digest)
            return cached
    manifest = Manifest.from_bytes((version.manifest_json or "").encode("utf-8"))
    if manifest.digest != version.digest:
        raise IntegrityError(f"{version.name}@{version.number}: the stored manifest does not match its digest "
                             f"{version.digest}", hint="the metadata database was altered; restore it from a backup")
    with _MANIFESTS_LOCK:
        _MANIFESTS[version.digest] = manifest
        while len(_MANIFESTS) > _MANIFESTS_KEPT:
            _MANIFESTS.popitem(last=False)
    return manifest
