"""Models and versions: reads (models, versions, resolve, build records, signatures, compat, alias history) and writes (publish, aliases, status)."""
from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from ...blobs.packed import PackedPart, check_packed
from ...errors import IntegrityError, NotFoundError, UsageError
from ...format.packs import PackIndex
from ...refs import Ref, validate_alias, validate_digest, validate_name
from ...remote.wire import encode
from ...store import writes
from ...store.records import PublishRequest
from .. import blobio, derived, fields, ownership
from ..auth import Call, authenticated, on_model
from ..state import ServerState
from ._common import json_body_doc, server_state

router = APIRouter()


# -- reads ------------------------------------------------------------------------------------

@router.get("/v1/models", tags=["models"])
def models(request: Request, call: Call = authenticated()) -> dict[str, Any]:
    """The models this token may pull."""
    return {"models": [encode(m) for m in server_state(request).meta.list_models()
                       if call.who.allows("pull", m.name)]}


@router.get("/v1/versions", tags=["models"])
def versions(request: Request, name: str, call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    return {"versions": encode(server_state(request).meta.list_versions(name))}


@router.get("/v1/resolve", tags=["models"])
def resolve(request: Request, ref: str, call: Call = on_model("pull", "query:ref")) -> Any:
    return encode(server_state(request).meta.resolve(Ref.parse(ref)))


@router.get("/v1/build", tags=["models"])
def build(request: Request, name: str, number: int,
          call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    return {"build": server_state(request).meta.build_info(name, number)}


@router.get("/v1/signatures", tags=["models"])
def signatures(request: Request, name: str, number: int,
               call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    return {"signatures": encode(server_state(request).meta.signatures(name, number))}


@router.post("/v1/signatures", tags=["models"],
             openapi_extra=json_body_doc(name="string", number="integer", signature="object", host="string"))
def add_signature(request: Request, call: Call = on_model("push", "body:name")) -> dict[str, Any]:
    """Record a signature of an existing version (``pt2reg sign``), audited as ``sign``; its form
    and digest are checked here (exit 5 / 422), its key by whoever trusts it."""
    body = call.body
    record = server_state(request).meta.add_signature(
        validate_name(fields.text(body, "name")), fields.number(body, "number"), fields.mapping(body, "signature"),
        **call.writer())
    return {"signature": encode(record)}


@router.post("/v1/compat", tags=["models"],
             openapi_extra=json_body_doc(ref="string", target="object", device="string", trust_native="boolean"))
def compat(request: Request, call: Call = on_model("pull", "body:ref")) -> dict[str, Any]:
    """Can the runtime ``target`` (``pt2reg target --json``) load the version ``ref`` names?
    Decided from its manifest alone (the window, operators, devices, variants): the
    ``pt2reg verify --target`` report, without the rules about the asking process. AOTInductor
    variants count only with ``trust_native`` (the server does not know the caller's trust)."""
    from ...runtime.compat import check
    from ...runtime.device import Device
    from ...runtime.target import Target

    body = call.body
    version = server_state(request).meta.resolve(Ref.parse(fields.text(body, "ref", max_len=512)))
    target = Target.from_json(fields.mapping(body, "target"), where="target")
    device = fields.opt_text(body, "device", max_len=64)
    report = check(derived.manifest_of(version), target, Device.parse(device) if device else None,
                   allow_native=fields.flag(body, "trust_native"), this_process=False)
    return {**report.to_json(), "ref": f"{version.name}@{version.number}", "digest": version.digest,
            "target": target.summary()}


@router.get("/v1/alias-at", tags=["models"])
def alias_at(request: Request, name: str, alias: str, when: str,
             call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    at = fields.when(when, "when")
    assert at is not None
    return {"number": server_state(request).meta.alias_at(name, validate_alias(alias), at)}


#: keys the stand-in ids of restricted lineage nodes (per process: ids stay stable within one
#: server's answers, and say nothing about the content they stand for)



# -- writes -----------------------------------------------------------------------------------

@router.post("/v1/publish", tags=["models"],
             openapi_extra=json_body_doc(name="string", digest="string", manifest_json="string",
                                 size="integer", blobs="array", aliases="array", metadata="object",
                                 build="object", lineage="array", signatures="array",
                                 environment="object", host="string", ref_for_audit="string",
                                 claim="integer", packs_json="string"))
def publish(request: Request,
            call: Call = on_model("push", "body:name", also=(("alias", "aliases"),))) -> dict[str, Any]:
    """Record a version once every blob it names is stored (checked under the store's gc
    lock, so a version never becomes visible with a blob missing or unverified). What the
    manifest determines (size, metadata, blobs) is derived from it (``derived``); a blob is
    taken only when this token may adopt it (``ownership``); a parent, only when it is a
    version this token may pull (``writes.check_parents``)."""
    state = server_state(request)
    body = call.body
    name = validate_name(fields.text(body, "name"))
    digest = validate_digest(fields.text(body, "digest"))
    sent_blobs = _blob_pairs(body, state.limits.batch_items)
    manifest_json = fields.text(body, "manifest_json", max_len=state.limits.publish_body)
    index = PackIndex.from_json(fields.opt_text(body, "packs_json", max_len=state.limits.publish_body))
    found = derived.derive(name, digest, manifest_json, index)
    derived.require_agreement(name, found, size=fields.opt_number(body, "size"),
                              metadata=fields.opt_mapping(body, "metadata"), blobs=sent_blobs)
    claim_id = fields.opt_number(body, "claim")
    claim = ownership.claim_of(state, claim_id) if claim_id is not None else None
    if claim_id is not None and (claim is None or not ownership.is_own(call.who, claim)):
        raise writes.lost_claim_error(name, digest)  # another token's claim: as if it were gone
    refused = ownership.unavailable(state, call.who, found.blobs, claim)
    if refused:  # the answer for a blob the store lacks: whose it is stays unsaid
        raise writes.missing_blobs_error(name, digest, refused)
    _check_pack_index(state, name, index)
    sizes = dict(found.blobs)

    def missing(digests: list[str]) -> list[str]:
        return blobio.missing_blobs(state, [(d, sizes.get(d)) for d in digests])

    publish_request = PublishRequest(
        name, digest, manifest_json, found.size, found.blobs,
        aliases=[validate_alias(a) for a in fields.items(body, "aliases")],
        metadata=found.metadata, build=fields.opt_mapping(body, "build"),
        lineage=fields.items(body, "lineage"), signatures=fields.items(body, "signatures"),
        environment=fields.opt_mapping(body, "environment"),
        ref_for_audit=fields.opt_text(body, "ref_for_audit"), claim=claim_id, packs=index or None)
    version, created = state.meta.publish(publish_request, missing_blobs=missing, identity=call.who, **call.writer())
    return {"version": encode(version), "created": created}


def _blob_pairs(body: dict[str, Any], limit: int) -> list[tuple[str, int]]:
    """A publish's ``blobs``: ``[digest, size]`` pairs (what the client says it uploaded)."""
    pairs = []
    for item in fields.items(body, "blobs", limit=limit):
        if not (isinstance(item, list) and len(item) == 2):
            raise UsageError("each of 'blobs' must be [digest, size]")
        d, size = validate_digest(item[0]), item[1]
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise UsageError(f"invalid size {size!r} for blob {d}")
        pairs.append((d, size))
    return pairs


def _check_pack_index(state: ServerState, name: str, index: PackIndex) -> None:
    """A pusher's pack index is a claim: every entry no recorded index of a version reading the
    same pack vouches for is read from its pack and hashed, so a recorded index never points a
    chunk at bytes that are not it (a later push reuses recorded entries)."""
    if not index:
        return
    known = state.meta.recorded_pack_entries([p.digest for p in index.packs])
    memo = state.pack_checks
    unknown = [(PackedPart(e.chunk, 0, e.size, p.digest, e.offset), memo.key(e.chunk, p.digest, e.offset, e.size))
               for p in index.packs for e in p.entries if (e.chunk, p.digest, e.offset, e.size) not in known]
    verdicts = [memo.verdict(key) for _part, key in unknown]
    if False in verdicts:
        part = unknown[verdicts.index(False)][0]
        raise IntegrityError(f"cannot publish {name}: its pack index is wrong: chunk {part.digest} is not at offset "
                             f"{part.pack_offset} of pack {part.pack} (checked before); nothing was recorded",
                             hint=_WRONG_INDEX_HINT)
    todo = [u for u, v in zip(unknown, verdicts) if v is None]

    def checked(i: int, ok: bool) -> None:
        memo.record(todo[i][1], ok)
        state.counters.add("pack_entries_checked", 1)

    try:
        check_packed(state.blobs, [part for part, _key in todo], checked=checked)
    except NotFoundError as exc:
        raise IntegrityError(f"cannot publish {name}: a pack its index names is not stored ({exc.message}); "
                             f"nothing was recorded", hint="push again (it uploads the packs)") from None
    except IntegrityError as exc:
        raise IntegrityError(f"cannot publish {name}: its pack index is wrong: {exc.message}; nothing was recorded",
                             hint=_WRONG_INDEX_HINT) from None


_WRONG_INDEX_HINT = "push with pt2reg: the index must say where each chunk is in the packs it uploaded"


@router.put("/v1/alias", tags=["models"],
             openapi_extra=json_body_doc(name="string", alias="string", number="integer", host="string",
                                 ref_for_audit="string"))
def set_alias(request: Request, call: Call = on_model("alias", "body:name")) -> Any:
    body = call.body
    return encode(server_state(request).meta.set_alias(
        validate_name(fields.text(body, "name")), validate_alias(fields.text(body, "alias")),
        fields.number(body, "number"), ref_for_audit=fields.opt_text(body, "ref_for_audit"),
        identity=call.who, **call.writer()))


@router.delete("/v1/alias", tags=["models"])
def remove_alias(request: Request, name: str, alias: str, ref_for_audit: str | None = None,
                 host: str | None = None, call: Call = on_model("alias", "query:name")) -> Any:
    return encode(server_state(request).meta.remove_alias(
        name, validate_alias(alias), ref_for_audit=ref_for_audit, identity=call.who, **call.writer()))


@router.post("/v1/status", tags=["models"],
             openapi_extra=json_body_doc(name="string", number="integer", status="string", reason="string",
                                 host="string", ref_for_audit="string"))
def set_status(request: Request, call: Call = on_model("yank", "body:name")) -> Any:
    body = call.body
    return encode(server_state(request).meta.set_status(
        validate_name(fields.text(body, "name")), fields.number(body, "number"),
        fields.text(body, "status"), fields.opt_text(body, "reason"),
        ref_for_audit=fields.opt_text(body, "ref_for_audit"), **call.writer()))


