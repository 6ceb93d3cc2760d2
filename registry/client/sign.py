"""Signing a published version: an OMS statement naming it, recorded beside it (``pt2reg sign``).

A statement names the model, the version number, the bundle digest and the signing time
(``registry.format.oms``), so it can only be made once the version has its number: ``pt2reg
sign REF --key K`` signs an existing version, and ``push --sign K`` publishes, signs, and only
then moves the aliases it was given (an alias policy that requires the signature sees it).
The statement lists every member by the sha256 of its file, as OpenSSF Model Signing lists a
model directory, so ``model_signing verify`` accepts it over ``materialize --layout files``.
For example (``reg`` an open ``Registry``)::

    record = sign_version(reg, "team/m@4", "release.key")
    record.key_id, record.algorithm      # -> ('sha256:...', 'oms-v1')
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from ..format.manifest import Manifest
from ..format.signing import sign_statement_record
from ..refs import Ref

if TYPE_CHECKING:
    from ..store.records import SignatureRecord
    from .api import Registry

__all__ = ["member_digests", "sign_version", "sign_record"]

_BLOCK = 4 << 20


def member_digests(manifest: Manifest, read: Callable[[str], tuple[str | os.PathLike, int, int]]) -> dict[str, str]:
    """member path -> sha256 hex of its file: the manifest's own for a member it hashes whole,
    else hashed from ``read(path)`` = (file, offset, size) (a chunked member has only chunk
    digests in the manifest)."""
    out = {}
    for m in manifest.members:
        if m.sha256:
            out[m.path] = m.sha256.split(":", 1)[-1]
            continue
        path, offset, size = read(m.path)
        h = hashlib.sha256()
        with open(path, "rb") as f:
            f.seek(offset)
            left = size
            while left:
                block = f.read(min(_BLOCK, left))
                if not block:
                    raise OSError(f"{path}: short read while hashing member {m.path}")
                h.update(block)
                left -= len(block)
        out[m.path] = h.hexdigest()
    return out


def sign_record(key_path: str | os.PathLike, name: str, number: int, digest: str,
                members: Mapping[str, str]) -> dict[str, str]:
    """The ``oms-v1`` signature record of ``name@number`` (bundle ``digest``; its members'
    file digests given)."""
    return sign_statement_record(key_path, model=name, version=number, digest=digest, members=members)


def sign_version(registry: Registry, ref: str | Ref, key_path: str | os.PathLike) -> SignatureRecord:
    """Sign the version ``ref`` names with the key at ``key_path`` and record the signature
    (audited ``sign``; through the server when one is configured, with a ``push`` token).
    The members are fetched and verified first (the statement lists their file digests); the
    trust policy is not applied: this is how a version gets the signature it asks for."""
    from ..format.signing import load_private_key

    load_private_key(key_path)  # a bad key fails before anything is fetched
    version = registry.resolve(ref)
    src = registry.materialize(Ref(version.name, version=version.number), record=None, trust=False)
    members = member_digests(src.manifest, lambda p: (src.member_file(p), 0, os.path.getsize(src.member_file(p))))
    from ..config import actor, hostname

    record = sign_record(key_path, version.name, version.number, version.digest, members)
    return registry.meta.add_signature(version.name, version.number, record, actor=actor(), host=hostname())
