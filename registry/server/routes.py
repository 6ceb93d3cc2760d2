"""The routes of the wire protocol (``/v1/...``), each declaring its permission (``auth``).

Routes are plain ``def`` functions: FastAPI runs them in its thread pool, where the
synchronous SQL store belongs. Every write passes ``actor`` = the token's owner,
``host`` = what the client says, and ``audit_details`` = the token id (``Call.writer``).
Model names contain '/', so they travel as query parameters.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import secrets
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from ..access.scopes import ADMIN, AUDIT_READ
from ..blobs.packed import PackedPart, check_packed
from ..errors import AccessDeniedError, IntegrityError, NotFoundError, UsageError
from ..format.packs import PackIndex
from ..refs import Ref, validate_alias, validate_digest, validate_name
from ..remote.wire import encode
from ..store import writes
from ..store.migrate import HEAD_REVISION, ensure_schema
from ..store.records import LineageNode, PublishRequest
from . import blobio, derived, fields, ownership
from .auth import Call, authenticated, on_blobs, on_model, on_scope, public
from .client_events import admit_event
from .state import ServerState

__all__ = ["router", "server_state", "json_body_doc", "redacted_node"]

router = APIRouter()
_EVENT_ACTIONS = ("pull", "load")
_DIRECTIONS = ("ancestors", "descendants")


def server_state(request: Request) -> ServerState:
    return request.app.state.registry


def json_body_doc(**props: str) -> dict[str, Any]:
    """OpenAPI ``requestBody`` for a JSON body read by the route (``name="string"`` ...)."""
    def schema(kind: str) -> dict[str, Any]:
        return {"type": "array", "items": {}} if kind == "array" else {"type": kind}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": {
        "type": "object", "properties": {k: schema(v) for k, v in props.items()}}}}}}



# -- health -----------------------------------------------------------------------------------

@router.get("/healthz", tags=["health"])
def healthz(call: Call = public()) -> dict[str, Any]:
    """The process answers."""
    return {"ok": True}


@router.get("/readyz", tags=["health"])
def readyz(request: Request, call: Call = public()) -> Any:
    """Ready when the database answers and its schema is at head (503 otherwise)."""
    ensure_schema(server_state(request).meta.engine, auto_create=False)
    return {"ok": True, "schema": HEAD_REVISION}


@router.get("/v1/openapi.json", tags=["health"], include_in_schema=False)
def openapi_document(request: Request, call: Call = public()) -> Any:
    return request.app.openapi()


# -- who and when -----------------------------------------------------------------------------

@router.get("/v1/whoami", tags=["access"])
def whoami(call: Call = authenticated()) -> dict[str, Any]:
    who = call.who
    return {"owner": who.owner, "token_id": who.token_id, "scopes": [s.text for s in who.scopes],
            "expires_at": encode(who.expires_at)}


@router.get("/v1/now", tags=["access"])
def now(request: Request, call: Call = authenticated()) -> dict[str, Any]:
    """The database's clock (push claims are judged by it)."""
    return {"now": encode(server_state(request).meta.db_now())}


@router.get("/v1/stats", tags=["admin"])
def stats(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    """Blob bytes this process streamed itself, and presigned URLs it signed."""
    return server_state(request).counters.snapshot()


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
    from ..runtime.compat import check
    from ..runtime.device import Device
    from ..runtime.target import Target

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
_RESTRICTED_KEY = secrets.token_bytes(32)


def redacted_node(node: LineageNode, call: Call) -> LineageNode:
    """A node of a model the token may not pull: its place in the graph, nothing else. Its
    digest is replaced by an opaque id (``restricted:<hex>``, an HMAC of it under a key of
    this process), so two paths to the same hidden version still meet in a graph, while the
    content address, which would confirm a guess of what the version holds, is not shown."""
    if call.who.allows("pull", node.name):
        return dataclasses.replace(node, edges=[_edge_redacted(e, call) for e in node.edges])
    return LineageNode(name="restricted", number=0, digest=_stand_in(node.digest), status="restricted",
                       depth=node.depth,
                       edges=[_edge_redacted(e, call) for e in node.edges if e.kind == "parent"])


def _stand_in(digest: str | None) -> str | None:
    """The opaque id a restricted version's digest is shown as (the same wherever it appears,
    so a parent edge still names its node)."""
    if not digest:
        return digest
    return "restricted:" + hmac.new(_RESTRICTED_KEY, digest.encode(), hashlib.sha256).hexdigest()[:32]


def _edge_redacted(edge: Any, call: Call) -> Any:
    if edge.kind != "parent":
        return edge
    try:
        parent = Ref.parse(edge.value).name
    except UsageError:
        parent = None
    if parent is not None and call.who.allows("pull", parent):
        return edge
    return dataclasses.replace(edge, value="restricted", digest=_stand_in(edge.digest), extra=None)


@router.get("/v1/lineage", tags=["lineage"])
def lineage(request: Request, name: str, number: int, direction: str = "ancestors",
            call: Call = on_model("pull", "query:name")) -> dict[str, Any]:
    """Ancestors or descendants; nodes of models the token may not pull are redacted."""
    if direction not in _DIRECTIONS:
        raise UsageError(f"invalid direction {direction!r}", hint="ancestors or descendants")
    meta = server_state(request).meta
    nodes = meta.ancestors(name, number) if direction == "ancestors" else meta.descendants(name, number)
    return {"nodes": encode([redacted_node(n, call) for n in nodes])}


@router.get("/v1/lineage/dataset", tags=["lineage"])
def dataset_lineage(request: Request, uri: str, digest: str | None = None,
                    call: Call = authenticated()) -> dict[str, Any]:
    """Versions trained on a dataset and what derives from them, only models the token may pull."""
    if len(uri) > 4096:
        raise UsageError("dataset URI is longer than 4096 characters")
    if digest is not None:
        validate_digest(digest)
    nodes = server_state(request).meta.versions_from_dataset(uri, digest=digest)
    return {"nodes": encode([redacted_node(n, call) for n in nodes if call.who.allows("pull", n.name)])}


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

    request = PublishRequest(
        name, digest, manifest_json, found.size, found.blobs,
        aliases=[validate_alias(a) for a in fields.items(body, "aliases")],
        metadata=found.metadata, build=fields.opt_mapping(body, "build"),
        lineage=fields.items(body, "lineage"), signatures=fields.items(body, "signatures"),
        environment=fields.opt_mapping(body, "environment"),
        ref_for_audit=fields.opt_text(body, "ref_for_audit"), claim=claim_id, packs=index or None)
    version, created = state.meta.publish(request, missing_blobs=missing, identity=call.who, **call.writer())
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


@router.post("/v1/events", tags=["audit"],
             openapi_extra=json_body_doc(action="string", model="string", number="integer", digest="string",
                                 ref="string", host="string", details="object"))
def record_event(request: Request, call: Call = on_model("pull", "body:model")) -> Any:
    """A pull or load of a version (the events a client records that change no state); rate
    limited per token, bounded in size, about a version that exists (``client_events``)."""
    body = call.body
    action = fields.text(body, "action")
    if action not in _EVENT_ACTIONS:
        raise UsageError(f"event action {action!r} cannot be recorded through the server",
                         hint="pull or load")
    digest = fields.opt_text(body, "digest")
    event = {"model": validate_name(fields.text(body, "model")), "number": fields.opt_number(body, "number"),
             "digest": validate_digest(digest) if digest is not None else None, "ref": fields.opt_text(body, "ref"),
             "details": {**fields.mapping(body, "details"), **call.audit_details()}}
    admit_event(request, call, **event)  # 429, 413, 404 before anything is written
    return encode(server_state(request).meta.record_event(action, actor=call.who.owner, host=call.host(), **event))


# -- audit ------------------------------------------------------------------------------------

@router.get("/v1/audit/events", tags=["audit"])
def audit_events(request: Request, model: str | None = None, since: str | None = None,
                 call: Call = on_scope(AUDIT_READ)) -> dict[str, Any]:
    if model is not None:
        validate_name(model)
    events = server_state(request).meta.events(model=model, since=fields.when(since, "since"))
    return {"events": encode(events)}


@router.get("/v1/audit/hashes", tags=["audit"])
def audit_hashes(request: Request, seqs: str = "", call: Call = on_scope(AUDIT_READ)) -> dict[str, Any]:
    wanted = [s.strip() for s in seqs.split(",") if s.strip()]
    if len(wanted) > 10_000 or not all(s.isdigit() and len(s) < 19 for s in wanted):
        raise UsageError("seqs must be at most 10000 comma-separated event numbers")
    head, found = server_state(request).meta.audit_hashes([int(s) for s in wanted])
    return {"head": list(head) if head else None, "found": {str(k): v for k, v in found.items()}}


@router.get("/v1/audit/verify", tags=["audit"])
def audit_verify(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    return encode(server_state(request).meta.verify_audit_chain())


@router.get("/v1/audit/contents", tags=["audit"])
def audit_contents(request: Request, call: Call = on_scope(AUDIT_READ)) -> Any:
    verdict = server_state(request).meta.verify_version_contents()
    return JSONResponse(encode(verdict) if verdict is not None else None)


# -- push claims and gc -----------------------------------------------------------------------

@router.post("/v1/pending", tags=["push"],
             openapi_extra=json_body_doc(blobs="array", host="string", pid="integer", name="string"))
def begin_pending(request: Request,
                  call: Call = on_model("push", "body:name", optional=True)) -> dict[str, Any]:
    """Claim blobs a push is uploading. The claim's host reads ``remote:t<token id>:<host>``:
    gc judges a remote claim by its heartbeats (never by a process id on the server's own
    machine), and only the token that made a claim (or an admin) may refresh or end it. The
    model it pushes (``name``) is recorded: who may push or pull it may use what the claim
    uploads (``ownership``)."""
    body = call.body
    limit = server_state(request).limits.batch_items
    blobs = [validate_digest(d) for d in fields.items(body, "blobs", limit=limit)]
    pid = fields.number(body, "pid")
    name = fields.opt_text(body, "name")  # checked by the permission: the token may push it
    host = f"{ownership.claim_prefix(call.who)}{call.host()}"[:256]
    return {"id": server_state(request).meta.begin_pending(blobs, host, pid, name=name)}


def _own_claim(request: Request, call: Call, claim_id: int) -> None:
    """AccessDeniedError when the claim exists and another token made it (admins may)."""
    claim = ownership.claim_of(server_state(request), claim_id)
    if claim is not None and not ownership.is_own(call.who, claim):
        raise AccessDeniedError(f"push claim {claim_id} belongs to another token",
                                scope="admin", hint="a push refreshes and ends only its own claim")


@router.post("/v1/pending/{claim_id}/heartbeat", tags=["push"])
def heartbeat_pending(request: Request, claim_id: int, call: Call = on_model("push")) -> dict[str, Any]:
    _own_claim(request, call, claim_id)
    return {"alive": server_state(request).meta.heartbeat_pending(claim_id)}


@router.delete("/v1/pending/{claim_id}", tags=["push"])
def end_pending(request: Request, claim_id: int, call: Call = on_model("push")) -> dict[str, Any]:
    _own_claim(request, call, claim_id)
    server_state(request).meta.end_pending(claim_id)
    return {}


@router.post("/v1/gc", tags=["admin"],
             openapi_extra=json_body_doc(dry_run="boolean", grace_seconds="number", host="string"))
def gc(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    """Collect garbage on the server's stores, audited as the token's owner."""
    from ..client.gc import collect_garbage

    state = server_state(request)
    grace = call.body.get("grace_seconds", 0.0)
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace < 0:
        raise UsageError("grace_seconds must be a number of seconds >= 0")
    result = collect_garbage(state.meta, state.blobs, dry_run=fields.flag(call.body, "dry_run"),
                             grace_seconds=float(grace), **call.writer())
    return {**encode(result), "reclaimed_bytes": result.reclaimed_bytes}


# -- tokens -----------------------------------------------------------------------------------

@router.post("/v1/tokens", tags=["admin"],
             openapi_extra=json_body_doc(owner="string", scopes="array", expires_at="string", host="string"))
def create_token(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    body = call.body
    scopes = fields.items(body, "scopes", limit=100)
    if not all(isinstance(s, str) for s in scopes):
        raise UsageError("'scopes' must be a list of scope strings")
    record, secret = server_state(request).meta.create_token(
        fields.text(body, "owner", max_len=64), scopes,
        expires_at=fields.when(fields.opt_text(body, "expires_at"), "expires_at"), **call.writer())
    return {"token": encode(record), "secret": secret}


@router.get("/v1/tokens", tags=["admin"])
def list_tokens(request: Request, call: Call = on_scope(ADMIN)) -> dict[str, Any]:
    return {"tokens": encode(server_state(request).meta.list_tokens())}


@router.delete("/v1/tokens/{token_id}", tags=["admin"])
def revoke_token(request: Request, token_id: int, host: str | None = None,
                 call: Call = on_scope(ADMIN)) -> Any:
    return encode(server_state(request).meta.revoke_token(token_id, **call.writer()))


# -- blobs ------------------------------------------------------------------------------------

def _blob_items(body: dict[str, Any], limit: int) -> list[tuple[str, int]]:
    out = []
    for item in fields.items(body, "blobs", limit=limit):
        if not isinstance(item, dict):
            raise UsageError("each of 'blobs' must be {digest, size}")
        size = fields.number(item, "size")
        if size < 0:
            raise UsageError(f"invalid size {size} for blob {item.get('digest')!r}")
        out.append((validate_digest(fields.text(item, "digest")), size))
    return out


@router.post("/v1/blobs/upload", tags=["blobs"],
             openapi_extra=json_body_doc(blobs="array", name="string"))
def upload_blobs(request: Request,
                 call: Call = on_model("push", "body:name", optional=True)) -> dict[str, Any]:
    """Which blobs the store lacks, each with where to PUT it (a presigned S3 URL, or this
    server's own ``/v1/blobs/{digest}`` for a local store). A stored blob this token may not
    adopt (``ownership``) is asked for like a missing one: its bytes are the proof."""
    state = server_state(request)
    items = _blob_items(call.body, state.limits.batch_items)
    too_big = [d for d, n in items if n > state.limits.blob_body]
    if too_big and not state.presigns:
        raise UsageError(f"blob {too_big[0]} is larger than this server's limit of "
                         f"{state.limits.blob_body} bytes per blob")
    present = ownership.adoptable(state, call.who, items, ownership.own_claims(state, call.who))
    return blobio.upload_plan(state, request, items, present=present, uploader=ownership.uploader_tag(call.who))


@router.post("/v1/chunks/locate", tags=["blobs"],
             openapi_extra=json_body_doc(digests="array", name="string"))
def locate_chunks(request: Request, call: Call = on_model("push", "body:name")) -> dict[str, Any]:
    """Where each chunk is stored inside a pack (``[pack, pack size, offset, size]``) of the
    model ``name`` a push is pushing to (the token may push to it), for a push that would
    otherwise store the chunk again. Only that model's packs (see ``locate_chunks``)."""
    state = server_state(request)
    name = validate_name(fields.text(call.body, "name"))
    digests = [validate_digest(d) for d in fields.items(call.body, "digests", limit=state.limits.batch_items)]
    found = state.meta.locate_chunks(digests, name=name)
    return {"locations": {c: [loc.pack, loc.pack_size, loc.offset, loc.size] for c, loc in found.items()}}


@router.post("/v1/blobs/download", tags=["blobs"],
             openapi_extra=json_body_doc(digests="array"))
def download_blobs(request: Request, call: Call = on_blobs("body:digests")) -> dict[str, Any]:
    """Where to GET each blob: presigned S3 URLs, or this server's own URLs."""
    digests = [validate_digest(d) for d in call.body["digests"]]
    return blobio.download_urls(server_state(request), request, digests)


@router.put("/v1/blobs/{digest}", tags=["blobs"],
            openapi_extra={"requestBody": {"required": True, "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}})
async def put_blob(request: Request, digest: str,
                   call: Call = on_model("push", json_body=False)) -> dict[str, Any]:
    """One blob's bytes (local store only), verified while written, and noted as this token's
    upload in its claims that list the blob (``ownership``)."""
    state = server_state(request)
    answer = await blobio.receive_blob(state, request, validate_digest(digest))
    await run_in_threadpool(ownership.record_upload, state, call.who, digest)
    return answer


@router.get("/v1/blobs/{digest}", tags=["blobs"])
def get_blob(request: Request, digest: str, call: Call = on_blobs("path:digest")) -> Response:
    """The bytes (``Range`` supported), or a 307 to a presigned S3 GET."""
    return blobio.serve_blob(server_state(request), request, digest)


@router.head("/v1/blobs/{digest}", tags=["blobs"])
def head_blob(request: Request, digest: str,
              call: Call = on_blobs("path:digest", or_action="push")) -> Response:
    return blobio.head_blob(server_state(request), digest)
