"""Authorization at one choke point: every route declares its permission here, or it does not run.

A route takes exactly one parameter whose default is one of the dependencies below; it
authenticates the bearer token, reads and validates what the permission is about (a model
name from the query or the JSON body, a ref, blob digests), and calls ``Identity.require``
before the route's body runs. It hands the route a :class:`Call`: the identity, the parsed
JSON body and the audit fields every write passes on. ``tests/unit/test_server_routes.py``
walks ``app.routes`` and fails on any route without one of these (``PERMISSION_ATTR``).

    @router.get("/v1/versions")
    def versions(name: str, call: Call = on_model("pull", "query:name")): ...

Sources (``where:key``): ``query:`` a query parameter, ``body:`` a JSON body field, ``path:``
a path parameter. Names, refs and digests are validated before any query runs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastapi import Depends, Request
from starlette.concurrency import run_in_threadpool

from ..access.scopes import ADMIN, AUDIT_READ, Identity
from ..access.tokens import looks_like_token
from ..errors import NotAuthenticatedError, NotFoundError, UsageError
from ..refs import Ref, validate_digest, validate_name
from ..remote.wire import FEATURES_HEADER, client_features
from .limits import parse_json_body

__all__ = ["Permission", "Call", "PERMISSION_ATTR", "public", "authenticated", "on_model",
           "on_scope", "on_blobs", "SESSION_COOKIE", "on_page", "page_scope",
           "page_authenticated"]

PERMISSION_ATTR = "__registry_permission__"
#: the web pages' session cookie: the token itself, HttpOnly + SameSite=Strict, so the server
#: keeps no session state (any replica authenticates it) and a revoked token ends the session
SESSION_COOKIE = "pt2reg_session"
_MAX_HOST = 200


@dataclass(frozen=True)
class Permission:
    """What a route needs. ``kind``: public | authenticated | model | scope | blobs."""

    kind: str
    action: str | None = None
    source: str | None = None                          # where the model name / digests come from
    also: tuple[tuple[str, str], ...] = ()             # (action, body field): needed when truthy
    or_action: str | None = None                       # blobs: this action on a model using it suffices
    json_body: bool = True                             # False: the route streams a raw body
    optional: bool = False                             # source absent: the action on some model
    session: bool = False                              # a web page: the token comes from the cookie

    def describe(self) -> str:
        if self.kind in ("public", "authenticated"):
            return self.kind
        extra = "".join(f" +{a} if {f}" for a, f in self.also)
        page = " (page)" if self.session else ""
        return f"{self.kind}:{self.action or ''}:{self.source or '*'}{extra}{page}"


@dataclass(frozen=True)
class Call:
    """One authorized request: who (``identity``, None on public routes), its JSON ``body``
    ({} without one), and the client's network address."""

    identity: Identity | None
    body: dict[str, Any] = field(default_factory=dict)
    client_addr: str = "unknown"
    query_host: str | None = None

    @property
    def who(self) -> Identity:
        assert self.identity is not None, "a public route asked for an identity"
        return self.identity

    def host(self) -> str:
        """The host the client says it is (body ``host``, else query ``host``), else its address."""
        claimed = self.body.get("host") if "host" in self.body else self.query_host
        if claimed is None or claimed == "":
            return self.client_addr
        if not isinstance(claimed, str) or len(claimed) > _MAX_HOST or not claimed.isprintable():
            raise UsageError(f"invalid host {str(claimed)[:40]!r}",
                             hint=f"printable text of at most {_MAX_HOST} characters")
        return claimed

    def audit_details(self) -> dict[str, Any]:
        return {"token_id": self.who.token_id, "via": "server"}

    def writer(self) -> dict[str, Any]:
        """The keyword arguments every audited store write takes: identity from the token
        (never the client's claim), host as the client claims it."""
        return {"actor": self.who.owner, "host": self.host(), "audit_details": self.audit_details()}


def public() -> Any:
    """No token needed (health, readiness, the OpenAPI document)."""
    return _dependency(Permission("public"))


def authenticated() -> Any:
    """Any valid token."""
    return _dependency(Permission("authenticated"))


def on_model(action: str, source: str | None = None, *, also: tuple[tuple[str, str], ...] = (),
             json_body: bool = True, optional: bool = False) -> Any:
    """``action`` on the model named at ``source`` (``query:name``, ``body:name``, ``query:ref``
    for a ref's model); ``source=None``: ``action`` on some model. ``also``: further
    ``(action, body field)`` pairs required when that field is non-empty. ``json_body=False``:
    the route reads its (raw) body itself. ``optional``: a request without the source field
    needs ``action`` on some model (a push's first steps, before it names its model)."""
    return _dependency(Permission("model", action, source, also, json_body=json_body,
                                  optional=optional))


def on_scope(scope: str) -> Any:
    """A non-model scope: ``audit:read`` or ``admin``."""
    if scope not in (AUDIT_READ, ADMIN):
        raise ValueError(f"unknown scope {scope!r}")
    return _dependency(Permission("scope", scope))


def on_blobs(source: str, *, or_action: str | None = None) -> Any:
    """Blob reads: every digest at ``source`` (``path:digest`` or ``body:digests``) must be
    referenced by a version of a model the token may pull, else 404 naming one digest, the same
    answer whether another model's versions use it or none does. ``or_action``: that action
    on a model whose versions use it suffices too (a push's HEAD of a pack it reuses)."""
    return _dependency(Permission("blobs", "pull", source, (), or_action))


def on_page(action: str, source: str, *, also_query: tuple[str, ...] = ()) -> Any:
    """A web page about the model at ``source`` (``query:name`` / ``query:ref``), authenticated
    by the session cookie (never a Bearer header); ``also_query``: further query parameters
    holding refs whose models need ``action`` too (compare's second side)."""
    return _dependency(Permission("model", action, source, tuple((action, f"query:{q}") for q in also_query),
                                  json_body=False, session=True))


def page_scope(scope: str) -> Any:
    """A web page needing a non-model scope (the audit page: ``audit:read``)."""
    if scope not in (AUDIT_READ, ADMIN):
        raise ValueError(f"unknown scope {scope!r}")
    return _dependency(Permission("scope", scope, session=True))


def page_authenticated() -> Any:
    """A web page any valid session may see (the models list filters what it shows)."""
    return _dependency(Permission("authenticated", session=True))


# -- the dependency ----------------------------------------------------------------------------

def _dependency(permission: Permission) -> Any:
    async def check(request: Request) -> Call:
        return await _authorize(request, permission)

    setattr(check, PERMISSION_ATTR, permission)
    check.__name__ = f"permit_{permission.kind}"
    return Depends(check)


def _bearer(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise NotAuthenticatedError("this registry server needs a token",
                                    hint="set PT2REG_TOKEN, pass --token-file, or run `pt2reg login`")
    scheme, _, secret = header.partition(" ")
    secret = secret.strip()
    if scheme.lower() != "bearer" or not looks_like_token(secret):
        raise NotAuthenticatedError("the Authorization header does not hold a registry token",
                                    hint="send 'Authorization: Bearer pt2r_...'")
    return secret


def _session(request: Request) -> str:
    secret = (request.cookies.get(SESSION_COOKIE) or "").strip()
    if not secret:
        raise NotAuthenticatedError("not logged in", hint="log in with a registry token at /login")
    if not looks_like_token(secret):
        raise NotAuthenticatedError("the session cookie does not hold a registry token",
                                    hint="log in again at /login")
    return secret


def _from_query_or_path(request: Request, source: str) -> str | None:
    where, _, key = source.partition(":")
    if where == "query":
        return request.query_params.get(key)
    if where == "path":
        return request.path_params.get(key)
    return None


def _model_name(raw: Any, source: str) -> str:
    if raw is None:
        raise UsageError(f"missing {source.replace(':', ' parameter ', 1)}")
    if source.endswith("ref"):  # ``query:ref``, ``query:to_ref``: the ref's model
        return Ref.parse(raw).name if isinstance(raw, str) else validate_name(raw)
    return validate_name(raw)


async def _authorize(request: Request, permission: Permission) -> Call:
    state = request.app.state.registry
    client_addr = request.client.host if request.client else "unknown"
    query_host = request.query_params.get("host")
    if permission.kind == "public":
        return Call(None, {}, client_addr, query_host)
    secret = _session(request) if permission.session else _bearer(request)
    keys = [k for k, _ in request.query_params.multi_items()]
    if len(keys) != len(set(keys)):  # the permission and the route must read the same value
        raise UsageError("a query parameter is repeated", hint="give each parameter once")
    # what the permission is about, validated before any query (the token lookup included)
    name: str | None = None
    digests: list[str] | None = None
    source = permission.source
    if source and not source.startswith("body:"):
        raw = _from_query_or_path(request, source)
        if permission.kind == "blobs":
            digests = [validate_digest(raw or "")]
        else:
            name = _model_name(raw, source)
    identity: Identity = await run_in_threadpool(state.meta.authenticate, secret)
    body: dict[str, Any] = {}
    if permission.json_body and request.method in ("POST", "PUT", "PATCH"):
        body = parse_json_body(await request.body(), max_depth=state.limits.json_depth)
    if source and source.startswith("body:"):
        raw = body.get(source.partition(":")[2])
        if permission.kind == "blobs":
            digests = _digest_list(raw, state.limits.batch_items)
        elif raw is not None or not permission.optional:
            name = _model_name(raw, source)
    if permission.kind == "model":
        identity.require(permission.action or "", name)
        for action, fieldname in permission.also:
            if fieldname.startswith("query:"):  # a page naming a second model (compare)
                raw = request.query_params.get(fieldname.partition(":")[2])
                if raw:
                    identity.require(action, _model_name(raw, fieldname))
            elif body.get(fieldname):
                identity.require(action, name)
    elif permission.kind == "scope":
        identity.require(permission.action or "")
    elif permission.kind == "blobs":
        actions = ("pull", permission.or_action) if permission.or_action else ("pull",)
        await run_in_threadpool(_require_readable, state.meta, identity, digests or [], actions,
                                "packs" in client_features(request.headers.get(FEATURES_HEADER)))
    return Call(identity, body, client_addr, query_host)


def _digest_list(raw: Any, limit: int) -> list[str]:
    if not isinstance(raw, list):
        raise UsageError("'digests' must be a list of blob digests")
    if len(raw) > limit:
        raise UsageError(f"too many digests in one request ({len(raw)}, at most {limit})",
                         hint="split the request")
    return [validate_digest(d) for d in raw]


def _require_readable(meta: Any, identity: Identity, digests: list[str], actions: tuple[str, ...],
                      reads_packs: bool = True) -> None:
    """Every digest must belong to a version of a model ``identity`` may pull (or do one of
    ``actions`` on), else ``_blob_not_found``: one answer for a blob no version references and for
    one only models hidden from the token use, so no answer tells that a hidden model holds a
    digest."""
    owners = meta.pullable_blob_models(sorted(set(digests)))
    for digest in digests:
        if not any(identity.allows(action, m) for m in owners.get(digest, ()) for action in actions):
            raise _blob_not_found(digest, reads_packs)


def _blob_not_found(digest: str, reads_packs: bool = True) -> NotFoundError:
    """The answer for a blob the token may not read, whether or not it is stored. A client that
    does not say it reads packs (``wire.FEATURES_HEADER``: one older than packs) is told it may
    be a chunk kept in a pack."""
    return NotFoundError(f"blob {digest} not found: no version this token may pull references it",
                         what="blob", name=digest,
                         hint=None if reads_packs else "a version pushed by a newer pt2-registry keeps its "
                         "small tensors in packs, which this client predates: upgrade pt2-registry")
