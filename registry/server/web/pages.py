"""The web pages (``/``): models, a model, a version, compare, audit; read-only, server-rendered.

Every page declares its permission at the one choke point (``registry.server.auth``: the
``page*``/``on_page`` dependencies, authenticated by the session cookie), so a page about a
model the token may not pull is a 403 before anything is read, and lists show only what the
token may pull. The login form takes a token and hands it back as an HttpOnly, SameSite=Strict
cookie: the server keeps no session, so any replica serves any page. Login and logout accept a
POST only from the registry's own pages (``origin``: a same-origin ``Origin`` or ``Referer``).
"""
from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from ...access.scopes import AUDIT_READ
from ...errors import NotAuthenticatedError, RegistryError, UsageError
from ...format.manifest import baked_device_groups
from ...refs import Ref
from ...runtime.compat import release_matrix
from ..auth import SESSION_COOKIE, Call, on_page, page_authenticated, page_scope, public
from ..derived import manifest_of
from ..fields import when as parse_when
from ..routes import redacted_node
from ..state import ServerState
from .compare import compare_manifests
from .lineage import layout
from .origin import foreign_post, own_origin
from .render import render

if TYPE_CHECKING:
    from ...store.sql import SqlMetadataStore

__all__ = ["router", "PAGE_PATHS", "error_page"]

router = APIRouter(tags=["web"], include_in_schema=False)
_MAX_EVENTS = 200


def server_state(request: Request) -> ServerState:
    return request.app.state.registry


#: every page: no framing (clickjacking), no MIME sniffing, no referrer to other sites (page URLs
#: carry model names; within the registry the browser sends it, and a real Origin on the login
#: and logout forms: under "no-referrer" it would send "Origin: null", see ``origin``), no caching
#: by shared proxies (pages show what one token may see), and a CSP that only runs the pages' own
#: inline script/style and loads nothing from elsewhere
PAGE_HEADERS = {"X-Frame-Options": "DENY", "X-Content-Type-Options": "nosniff", "Referrer-Policy": "same-origin",
                "Cache-Control": "no-store, private",
                "Content-Security-Policy": "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                                           "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; "
                                           "base-uri 'none'"}


def _html(body: str, status: int) -> HTMLResponse:
    return HTMLResponse(body, status_code=status, headers=PAGE_HEADERS)


def _page(request: Request, template: str, call: Call | None, status: int = 200, **values: Any) -> HTMLResponse:
    who = call.identity if call else None
    return _html(render(template, who=who, path=request.url.path, **values), status)


# -- login ------------------------------------------------------------------------------------

def _safe_next(target: str | None) -> str:
    """Only a path on this server (no ``//host`` or scheme): the login form is no open redirect."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target \
            or len(target) > 2048 or any(c.isspace() or not c.isprintable() for c in target):
        return "/"  # browsers drop tabs/newlines ("/\t/evil" -> "//evil") and read "\" as "/"
    return target


@router.get("/login")
def login_form(request: Request, next: str = "/", call: Call = public()) -> Response:
    return _page(request, "login.html", None, next=_safe_next(next), error=None)


def _foreign_post(request: Request) -> str | None:
    """Why this form POST is not from the registry's own pages (``origin``), None if it is."""
    own = own_origin(server_state(request).public_url, request.url.scheme, request.headers)
    return foreign_post(own, request.headers)


@router.post("/login")
async def login(request: Request, call: Call = public()) -> Response:
    form = {k: v[0] for k, v in parse_qs((await request.body()).decode("utf-8", "replace")[:8192]).items()}
    target = _safe_next(form.get("next"))
    why = _foreign_post(request)
    if why is not None:  # login CSRF: another page logging this browser in as someone else
        return _page(request, "login.html", None, status=403, next=target,
                     error=f"refused: log in from this registry's own login page ({why})")
    secret = (form.get("token") or "").strip()
    state = server_state(request)
    try:
        from starlette.concurrency import run_in_threadpool

        if not secret:
            raise NotAuthenticatedError("no token given", hint="paste a registry token (pt2r_...)")
        identity = await run_in_threadpool(state.meta.authenticate, secret)
    except NotAuthenticatedError as exc:
        return _page(request, "login.html", None, status=401, next=target, error=exc.message)
    response = RedirectResponse(target, status_code=303)
    max_age = None
    if identity.expires_at is not None:
        max_age = max(0, int((identity.expires_at - datetime.now(timezone.utc)).total_seconds()))
    response.set_cookie(SESSION_COOKIE, secret, max_age=max_age, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https"
                        or request.headers.get("x-forwarded-proto", "").split(",")[0].strip() == "https",
                        path="/")
    return response


@router.post("/logout")
def logout(request: Request, call: Call = public()) -> Response:
    why = _foreign_post(request)
    if why is not None:  # another page logging this browser out: the cookie stays
        return _html(render("error.html", who=None, path=request.url.path, title="Not permitted", status=403,
                            message=f"refused: log out from this registry's own pages ({why})",
                            hint="use the Log out button of a registry page"), 403)
    response = RedirectResponse("/login", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/", httponly=True, samesite="strict")
    return response


# -- models -----------------------------------------------------------------------------------

def _search(q: str) -> tuple[list[str], list[tuple[str, str]]]:
    """``bert env=prod`` -> name words ``['bert']``, metadata filters ``[('env', 'prod')]``."""
    words, pairs = [], []
    for part in q.split():
        key, eq, value = part.partition("=")
        if eq and key:
            pairs.append((key, value))
        else:
            words.append(part.lower())
    return words, pairs


@router.get("/")
def models_page(request: Request, q: str = "", call: Call = page_authenticated()) -> Response:
    if len(q) > 500:
        raise UsageError("search text is longer than 500 characters")
    meta = server_state(request).meta
    words, pairs = _search(q)
    latest = meta.latest_versions()
    rows = []
    for m in meta.list_models():
        if not call.who.allows("pull", m.name):
            continue  # never listed, never counted, never matched
        v = latest.get(m.name)
        if any(w not in m.name.lower() for w in words):
            continue
        if pairs and (v is None or any(k not in v.metadata or str(v.metadata[k]) != val for k, val in pairs)):
            continue
        changed = max((t for t in (m.created_at, v and v.created_at, v and v.status_at) if t), default=None)
        rows.append({"model": m, "latest": v, "changed": changed})
    return _page(request, "models.html", call, rows=rows, q=q)


VERSIONS_PER_PAGE = 100


@router.get("/model")
def model_page(request: Request, name: str, page: int = 1, call: Call = on_page("pull", "query:name")) -> Response:
    meta = server_state(request).meta
    first, count = meta.versions_page(name, limit=VERSIONS_PER_PAGE)
    pages = max(1, -(-count // VERSIONS_PER_PAGE))
    page = min(max(page, 1), pages)
    shown = first if page == 1 else meta.versions_page(
        name, offset=(page - 1) * VERSIONS_PER_PAGE, limit=VERSIONS_PER_PAGE)[0]
    history, moves = meta.find_events(model=name, action="alias", limit=50)
    lineage = None
    if first:
        newest = first[0]
        parents = [redacted_node(n, call) for n in meta.ancestors(name, newest.number) if n.depth == 1]
        children = [redacted_node(n, call) for n in meta.descendants(name, newest.number) if n.depth == 1]
        lineage = {"version": newest, "parents": parents, "children": children}
    return _page(request, "model.html", call, name=name, versions=shown, all_numbers=[v.number for v in first[:2]],
                 count=count, page=page, pages=pages,
                 aliases=meta.aliases(name), signed=meta.signature_counts(name),
                 attested=_attestation_counts(meta, name), history=history, moves=moves, lineage=lineage)


# -- a version --------------------------------------------------------------------------------

def _attestation_counts(meta: SqlMetadataStore, name: str) -> dict[int, tuple[int, int]] | None:
    """``number -> (passed, total)`` attestations of the versions of ``name``."""
    return meta.attestation_counts(name)


def _attestations(meta: SqlMetadataStore, name: str, number: int) -> list[Any] | None:
    return meta.attestations(name, number)


def _derived(prog: Any) -> list[Any]:
    return [c for c in prog.range_constraints if "+" in c.expr or "*" in c.expr]


@router.get("/version")
def version_page(request: Request, name: str, number: int, call: Call = on_page("pull", "query:name")) -> Response:
    meta = server_state(request).meta
    version = meta.resolve(Ref.parse(f"{name}@{number}"))
    manifest = manifest_of(version)
    ancestors = [redacted_node(n, call) for n in meta.ancestors(name, number)]
    descendants = [redacted_node(n, call) for n in meta.descendants(name, number)]
    me = next(n for n in ancestors if n.depth == 0)
    programs = [{"spec": prog, "derived": _derived(prog), "baked": baked_device_groups(prog.baked_devices)}
                for prog in manifest.programs.values()]

    return _page(request, "version.html", call, v=version, m=manifest, programs=programs,
                 signatures=meta.signatures(name, number), build=meta.build_info(name, number),
                 attestations=_attestations(meta, name, number), graph=layout(ancestors, descendants),
                 facts=[e for e in me.edges if e.kind != "parent"],
                 parents=[n for n in ancestors if n.depth == 1],
                 children=[n for n in descendants if n.depth == 1],
                 commands=_commands(version), releases=release_matrix(manifest))


def _commands(v: Any) -> list[tuple[str, str]]:
    pinned = f"{v.name}@{v.digest}"
    return [("pull, pinned to this digest", f"pt2reg pull {pinned} -o model.pt2b"),
            ("show", f"pt2reg show {v.name}@{v.number}"),
            ("inspect", f"pt2reg inspect {pinned}"),
            ("lineage", f"pt2reg lineage {v.name}@{v.number}"),
            ("check a runtime, before download", f"pt2reg verify {v.name}@{v.number} --target box.json")]


# -- compare ----------------------------------------------------------------------------------

@router.get("/compare")
def compare_page(request: Request, ref: str, to_ref: str,
                 call: Call = on_page("pull", "query:ref", also_query=("to_ref",))) -> Response:
    meta = server_state(request).meta
    a, b = meta.resolve(Ref.parse(ref)), meta.resolve(Ref.parse(to_ref))
    return _page(request, "compare.html", call, a=a, b=b, c=compare_manifests(manifest_of(a), manifest_of(b)))


# -- audit ------------------------------------------------------------------------------------

VERIFY_TTL_S = 30.0


def _verdict(request: Request, fresh: bool) -> tuple[Any, float]:
    """The chain's verdict and its age in seconds. Re-walking the chain is O(events), so a
    verdict is reused for ``VERIFY_TTL_S`` while the chain's head is unchanged (a per-process
    cache: no session state; ``fresh`` re-verifies now)."""
    meta = server_state(request).meta
    head, _ = meta.audit_hashes()
    cached = getattr(request.app.state, "web_verdict", None)
    now = time.monotonic()
    if not fresh and cached and cached[0] == head and now - cached[1] < VERIFY_TTL_S:
        return cached[2], now - cached[1]
    verdict = meta.verify_audit_chain()
    request.app.state.web_verdict = (head, now, verdict)
    return verdict, 0.0


@router.get("/audit")
def audit_page(request: Request, call: Call = page_scope(AUDIT_READ)) -> Response:
    q = request.query_params
    form = {k: q.get(k, "") for k in ("model", "actor", "action", "since", "until")}
    events, total = server_state(request).meta.find_events(
        model=form["model"] or None, actor=form["actor"] or None, action=form["action"] or None,
        since=parse_when(form["since"] or None, "since"), until=parse_when(form["until"] or None, "until"),
        limit=_MAX_EVENTS)
    verdict, age = _verdict(request, fresh=q.get("verify") == "1")
    return _page(request, "audit.html", call, events=events, total=total, shown=len(events),
                 verdict=verdict, verdict_age=age, form=form)


# -- errors as pages --------------------------------------------------------------------------

PAGE_PATHS = frozenset({"/", "/model", "/version", "/compare", "/audit"})


def error_page(request: Request, exc: RegistryError, status: int) -> Response:
    """A page's error as a page: not logged in -> the login form; 403 says only that the
    token may not see it (never what is there); 404 and 400 say what was wrong."""
    if isinstance(exc, NotAuthenticatedError) and status == 401:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        return RedirectResponse("/login?" + urlencode({"next": target}), status_code=303)
    title = {403: "Not permitted", 404: "Not found", 400: "Bad request"}.get(status, "Error")
    message = exc.message if status != 403 else "This token may not view this page."
    if status >= 500:  # the API's handler scrubs these; a page says nothing of the inside
        return _html(render("error.html", who=None, path=request.url.path, title="Server error",
                            status=status, message="the server could not answer this page",
                            hint="see the server's log"), status)
    hint = exc.hint if status != 403 else "ask an admin for a token with the scope it needs"
    return _html(render("error.html", who=None, path=request.url.path, title=title, status=status,
                        message=message, hint=hint), status)

