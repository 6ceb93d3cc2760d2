"""Which stored blobs a token may make part of a version: authorize the bytes that are stored,
never the name a request gives them.

A blob that versions reference belongs to their models: a token that may pull or push one of
those models may publish it again (dedup within what it could read or write anyway). A blob
uploaded and not published yet belongs to the push claim that uploaded it, and so to the model
that claim pushes: it is adoptable, through a claim of its own that lists it, by the token that
uploaded it and by a token that may pull or push that model (several trainers pushing one
model share its new chunks), by no other. A blob used only by models the token may not read is
adoptable once the token uploaded it itself. Who uploaded what is recorded where the bytes
arrive:

- on S3, the presigned PUT the server hands out signs the uploader into the object's metadata
  (``S3BlobStore.presign_put(uploader=...)``), so S3 refuses the PUT without it and the object
  says whose PUT wrote its bytes last;
- over a local directory, the server receives the bytes itself and notes the upload in the
  uploader's claims that list the blob (``SqlMetadataStore.record_upload``).

Naming a digest and a size is never enough: a token gets another's bytes into its version only
by sending those bytes. A blob it may not adopt is ``missing`` to it, the same answer as a
blob the store lacks (the upload plan offers to take its bytes; a publish names it as missing),
so no answer tells that a hidden model, or another push, holds a digest.

    >>> uploader_tag(Identity(token_id=7, owner="ana", scopes=()))
    't7'
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..access.scopes import ADMIN, Identity
from ..store.records import PendingPush
from . import blobio

if TYPE_CHECKING:
    from .state import ServerState

__all__ = ["uploader_tag", "claim_prefix", "is_own", "own_claims", "claim_of", "adoptable", "unavailable",
           "record_upload"]


def uploader_tag(who: Identity) -> str:
    """What an upload records as its uploader: the token (``t<id>``)."""
    return f"t{who.token_id}"


def claim_prefix(who: Identity) -> str:
    """How a server's push claim names the token that made it (``remote:t<id>:<host>``)."""
    return f"remote:{uploader_tag(who)}:"


def is_own(who: Identity, claim: PendingPush) -> bool:
    """Whether ``who`` made ``claim`` (an admin: any claim counts as its own)."""
    return who.is_admin or claim.host.startswith(claim_prefix(who))


def own_claims(state: ServerState, who: Identity) -> list[PendingPush]:
    """The open push claims ``who`` made."""
    return [c for c in state.meta.pending_claims() if c.host.startswith(claim_prefix(who))]


def claim_of(state: ServerState, claim_id: int) -> PendingPush | None:
    """The open claim ``claim_id``, None when there is none."""
    return next((c for c in state.meta.pending_claims() if c.id == claim_id), None)


def adoptable(state: ServerState, who: Identity, blobs: list[tuple[str, int]],
              claims: list[PendingPush]) -> set[str]:
    """The digests of ``blobs`` that are stored and ``who`` may make part of a version, through
    one of ``claims`` (its own) for a blob no model it may pull or push uses (module docstring).
    An admin may adopt whatever is stored: it may read every blob anyway."""
    checks = blobio.blob_checks(state, blobs)
    stored = {d for d, _ in blobs if checks[d].ok}
    if who.allows(ADMIN):
        return stored
    mine = _used_by_its_models(state, who, stored)
    return mine | _uploaded_by(state, who, stored - mine, checks, claims)


def unavailable(state: ServerState, who: Identity, blobs: list[tuple[str, int]],
                claim: PendingPush | None) -> list[str]:
    """The digests of a publish's ``blobs`` the store lacks or ``who`` may not adopt through
    ``claim``, sorted: what the publish is refused as missing. A blob a model ``who`` may pull
    or push uses is left to the store's own check, made under the gc lock when it records."""
    if who.allows(ADMIN) or not blobs:
        return []
    mine = _used_by_its_models(state, who, {d for d, _ in blobs})
    foreign = [(d, n) for d, n in blobs if d not in mine]
    checks = blobio.blob_checks(state, foreign)
    stored = {d for d, _ in foreign if checks[d].ok}
    good = _uploaded_by(state, who, stored, checks, [claim] if claim is not None else [])
    return sorted({d for d, _ in foreign} - good)


def _used_by_its_models(state: ServerState, who: Identity, digests: set[str]) -> set[str]:
    """Those of ``digests`` a version of a model ``who`` may pull or push references."""
    owners = state.meta.pullable_blob_models(sorted(digests)) if digests else {}
    return {d for d, models in owners.items()
            if any(who.allows("pull", m) or who.allows("push", m) for m in models)}


def _uploaded_by(state: ServerState, who: Identity, digests: set[str], checks: dict[str, blobio.BlobCheck],
                 claims: list[PendingPush]) -> set[str]:
    """Those of ``digests`` (stored, used by no model ``who`` may pull or push) that one of
    ``claims`` lists and that were uploaded by ``who`` or under a claim for a model it may pull
    or push. The uploader: on S3 the token the object names, through its open claims that list
    the blob; over a local directory the open claims that noted the upload."""
    listed = {d for c in claims for d in c.blobs} & digests
    if not listed:
        return set()
    tag = uploader_tag(who)
    open_claims = state.meta.pending_claims()
    good = set()
    for digest in listed:
        if state.presigns:
            uploader = checks[digest].uploader
            if uploader == tag:
                good.add(digest)
                continue
            by = [c for c in open_claims if uploader and c.host.startswith(f"remote:{uploader}:") and digest in c.blobs]
        else:
            by = [c for c in open_claims if digest in c.uploaded]
            if any(c.host.startswith(claim_prefix(who)) for c in by):
                good.add(digest)
                continue
        if any(c.model and (who.allows("pull", c.model) or who.allows("push", c.model)) for c in by):
            good.add(digest)
    return good


def record_upload(state: ServerState, who: Identity, digest: str) -> None:
    """Note, over a local directory, that ``who`` sent the bytes of ``digest`` (in each of its
    claims that lists it; a claim made after the upload does not count it)."""
    state.meta.record_upload(digest, host_prefix=claim_prefix(who))
