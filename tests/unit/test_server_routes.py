"""Deny by default: every route the server mounts declares its permission at the one choke
point (``registry.server.auth``), and the wire protocol's table is what is mounted."""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.routing import APIRoute

from registry.config import Settings
from registry.server import create_app
from registry.server.auth import PERMISSION_ATTR, Call, Permission, on_model


def permission_of(dependency: Any) -> Permission | None:
    """The permission a route dependency declares (None: not one of ours); was
    ``registry.server.auth.permission_of``, used by no route."""
    return getattr(dependency, PERMISSION_ATTR, None)


def _walk(routes: list[Any]) -> Iterator[Any]:
    """Every mounted route, descending into included routers and mounts."""
    for route in routes:
        inner = getattr(route, "original_router", None) or getattr(route, "app", None)
        nested = getattr(inner, "routes", None)
        if nested is not None and not isinstance(route, APIRoute):
            yield from _walk(list(nested))
        else:
            yield route


def _permissions(route: Any) -> list[Permission]:
    if not isinstance(route, APIRoute):
        return []
    found = []
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        permission = permission_of(dep.call) if dep.call is not None else None
        if permission is not None:
            found.append(permission)
        stack.extend(dep.dependencies)
    return found


def undeclared(app: Any) -> list[str]:
    """Routes with no declared permission, or more than one (ambiguous)."""
    bad = []
    for route in _walk(list(app.routes)):
        if len(_permissions(route)) != 1:
            methods = ",".join(sorted(getattr(route, "methods", None) or ["?"]))
            bad.append(f"{methods} {getattr(route, 'path', route)!r}")
    return bad


@pytest.fixture
def app(tmp_path: Path) -> Any:
    app = create_app(Settings.resolve(home=str(tmp_path), env={}))
    yield app
    app.state.registry.close()


def test_every_mounted_route_declares_its_permission(app: Any) -> None:
    assert undeclared(app) == []


def test_an_undeclared_route_is_caught(app: Any) -> None:
    @app.get("/v1/leak")
    def leak() -> dict[str, str]:
        return {"everything": "here"}

    assert undeclared(app) == ["GET '/v1/leak'"]


def test_a_route_on_an_included_router_is_walked(app: Any) -> None:
    from fastapi import APIRouter

    extra = APIRouter()

    @extra.post("/v1/extra")
    def declared(call: Call = on_model("push")) -> dict[str, str]:
        return {}

    @extra.delete("/v1/extra")
    def forgot() -> dict[str, str]:
        return {}

    app.include_router(extra)
    assert undeclared(app) == ["DELETE '/v1/extra'"]


def test_public_routes_are_only_health_and_the_openapi_document(app: Any) -> None:
    public = sorted(route.path for route in _walk(list(app.routes))
                    if [p.kind for p in _permissions(route)] == ["public"])
    # the web UI's login form (GET shows it, POST checks the token) and logout
    # /v1/keys: the public key that signs the audit head (registry/server/audit_head.py)
    assert public == ["/healthz", "/login", "/login", "/logout", "/readyz", "/v1/keys",
                      "/v1/openapi.json"]


def test_the_protocol_table_is_mounted(app: Any) -> None:
    mounted = {(m, r.path) for r in _walk(list(app.routes)) for m in r.methods}
    table = {
        ("GET", "/v1/whoami"), ("GET", "/v1/models"), ("GET", "/v1/versions"), ("GET", "/v1/resolve"),
        ("GET", "/v1/build"), ("GET", "/v1/signatures"), ("POST", "/v1/signatures"), ("GET", "/v1/alias-at"),
        ("POST", "/v1/compat"),
        ("GET", "/v1/lineage"), ("GET", "/v1/lineage/dataset"), ("POST", "/v1/publish"),
        ("PUT", "/v1/alias"), ("DELETE", "/v1/alias"), ("POST", "/v1/status"), ("POST", "/v1/events"),
        ("GET", "/v1/audit/events"), ("GET", "/v1/audit/hashes"), ("GET", "/v1/audit/verify"),
        ("GET", "/v1/audit/contents"), ("POST", "/v1/pending"),
        ("POST", "/v1/pending/{claim_id}/heartbeat"), ("DELETE", "/v1/pending/{claim_id}"),
        ("GET", "/v1/now"), ("POST", "/v1/gc"), ("POST", "/v1/blobs/upload"),
        ("PUT", "/v1/blobs/{digest}"), ("POST", "/v1/blobs/download"), ("GET", "/v1/blobs/{digest}"),
        ("HEAD", "/v1/blobs/{digest}"), ("POST", "/v1/chunks/locate"), ("POST", "/v1/tokens"), ("GET", "/v1/tokens"),
        ("DELETE", "/v1/tokens/{token_id}"), ("GET", "/v1/openapi.json"), ("GET", "/healthz"),
        ("GET", "/readyz"), ("GET", "/v1/stats"),
        # alias policies and attestations (registry/server/governance.py)
        ("PUT", "/v1/policies"), ("DELETE", "/v1/policies"), ("GET", "/v1/policies"),
        ("POST", "/v1/attestations"), ("GET", "/v1/attestations"),
        # where versions were pushed as OCI artifacts (registry/server/oci.py)
        ("POST", "/v1/oci"), ("GET", "/v1/oci"), ("GET", "/v1/oci/repositories"),
        # webhooks and the signed audit head (registry/server/webhooks.py, audit_head.py)
        ("POST", "/v1/webhooks"), ("GET", "/v1/webhooks"), ("DELETE", "/v1/webhooks/{webhook_id}"),
        ("GET", "/v1/webhooks/deliveries"), ("POST", "/v1/webhooks/deliveries/{delivery_id}/redeliver"),
        ("GET", "/v1/keys"), ("GET", "/v1/audit/head"), ("GET", "/v1/audit/heads"),
        # the web pages (registry/server/web)
        ("GET", "/login"), ("POST", "/login"), ("POST", "/logout"), ("GET", "/"), ("GET", "/model"),
        ("GET", "/version"), ("GET", "/compare"), ("GET", "/audit"),
    }
    assert table == mounted


def test_only_the_web_pages_take_the_session_cookie(app: Any) -> None:
    """A page authenticates by the session cookie, never a Bearer header; the API the other
    way round (a cookie must not authorize an API call: no CSRF surface there)."""
    from registry.server.web import PAGE_PATHS

    for route in _walk(list(app.routes)):
        [permission] = _permissions(route)
        if route.path in PAGE_PATHS:
            assert permission.session and permission.kind != "public", route.path
        else:
            assert not permission.session, route.path


@pytest.mark.parametrize("raw", [b'{"a": "\\ud800"}', b'{"\\udfff": 1}', b'{"a": ["x", {"b": "\\uDC00z"}]}',
                                 b'{"manifest_json": "{\\"k\\": \\"\\ud800\\"}"}'])
def test_a_request_body_with_a_lone_surrogate_is_refused_as_bad_input(raw: bytes) -> None:
    """JSON lets ``\\ud800`` stand alone, and a string holding it cannot be encoded again (a
    publish hashes its manifest text): refused at the edge, 400, never a 500 later."""
    from registry.errors import UsageError
    from registry.server.limits import parse_json_body

    with pytest.raises(UsageError, match="lone surrogate"):
        parse_json_body(raw, max_depth=8)
    assert parse_json_body(b'{"a": "\\ud83d\\ude00"}', max_depth=8) == {"a": "\U0001F600"}   # a pair
    assert parse_json_body(b'{"a": "\\\\ud800"}', max_depth=8) == {"a": "\\ud800"}   # a backslash, then text
