"""The web UI attacked (reviewer R3): every user-controlled string a page shows carries markup
(metadata keys and values, Dim and tensor names, op names and schemas, dataset URIs incl.
``javascript:``, run id, commit, token owners, status reasons, attestation labels and errors):
no page renders it as markup, no link takes a ``javascript:`` URL. A ``team/*`` token never
sees ``other/x`` through any page, search, compare side, lineage node or the audit page; a
revoked token's cookie is refused at once; the login form is no open redirect; odd models
(yanked, only failed attestations) render. In process (ASGI), no browser: fast.
"""
from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest

from registry.format.manifest import Manifest
from registry.store.records import LineageEdge
from tests.store_calls import publish
from tests.unit.test_manifest import minimal

X = "\"'><script>alert(1)</script><img src=x onerror=alert(2)>"
ZERO = "sha256:" + "0" * 64


def _text(tag: str, edit: Any = None) -> tuple[str, str]:
    raw = copy.deepcopy(minimal())
    raw["metadata"] = {"tag": tag, X: X, "javascript": "javascript:alert(3)"}
    prog = raw["programs"]["model"]
    prog["inputs"][0]["name"] = X
    prog["inputs"][0]["shape"][0]["dim"] = X
    prog["range_constraints"][0]["dim"] = X
    prog["outputs"][0]["name"] = X
    prog["required_ops"] = [{"name": "evil::op", "overload": "default", "target": "torch.ops.evil.op.default",
                             "schema": X}]
    if edit:
        edit(raw)
    text = Manifest.from_raw(raw).canonical.decode()
    return text, Manifest.from_bytes(text.encode()).digest


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from registry.config import Settings
    from registry.server import create_app

    app = create_app(Settings.resolve(home=str(tmp_path_factory.mktemp("webx")), env={}))
    meta = app.state.registry.meta
    w = {"actor": X, "host": X}

    def pub(name: str, tag: str, lineage: list = (), **kw: Any) -> Any:
        text, digest = _text(tag)
        return publish(meta, name, digest, text, 10, [(ZERO, 10)], metadata={"tag": tag, X: X}, lineage=lineage,
                            build={X: X}, environment={"python": X}, **w, **kw)[0]

    other = pub("other/x", "o1")
    base = pub("team/base", "b1", lineage=[LineageEdge("dataset", "javascript:alert(4)"),
                                           LineageEdge("dataset", X), LineageEdge("run", X),
                                           LineageEdge("commit", X)])
    pub("team/ft", "f1", lineage=[LineageEdge("parent", f"{base.name}@1", base.digest),
                                  LineageEdge("parent", "other/x@1", other.digest)])
    pub("other/kid", "k1", lineage=[LineageEdge("parent", "team/base@1", base.digest)])
    pub("team/ft", "f2")
    meta.set_status("team/ft", 2, "yanked", X, **w)
    try:
        meta.set_alias("team/ft", "prod", 1, **w)
    except Exception:  # noqa: BLE001
        pass
    meta.record_attestation("team/ft", 1, label="gpu-ci", passed=False, device=X, target={X: X}, results=[], error=X, **w)
    tokens = {who: meta.create_token(owner, scopes, expires_at=None, actor="t", host="t")
              for who, owner, scopes in (("admin", "a+b@x.y", ["admin"]), ("team", "team-" + "a", ["model:team/*:pull"]),
                                         ("gone", "gone", ["admin"]))}
    with TestClient(app, base_url="http://testserver") as c:
        c.tokens = {k: v[1] for k, v in tokens.items()}
        c.ids = {k: v[0].id for k, v in tokens.items()}
        c.meta = meta
        yield c


#: what a browser sends with the login form of the TestClient's own origin (``pages.origin``)
SAME_ORIGIN = {"Origin": "http://testserver"}


def _login(client: Any, who: str) -> None:
    client.cookies.clear()
    r = client.post("/login", data={"token": client.tokens[who], "next": "/"}, headers=SAME_ORIGIN,
                    follow_redirects=False)
    assert r.status_code == 303


PAGES = ["/", "/?q=tag%3Db1", "/model?name=team/ft", "/model?name=team/base", "/version?name=team/base&number=1",
         "/version?name=team/ft&number=1", "/version?name=team/ft&number=2", "/compare?ref=team/ft@1&to_ref=team/ft@2",
         "/compare?ref=team/ft@2&to_ref=team/base@1", "/audit", "/audit?actor=" + "%22%3E%3Cscript%3E"]


def _no_markup(body: str, url: str) -> None:
    assert "<script>alert" not in body and "<img src=x" not in body and "onerror=alert" not in body.replace(
        "onerror=alert(2)&gt;", ""), url
    for attr in re.findall(r'(?:href|src|action|xlink:href)\s*=\s*"([^"]*)"', body, flags=re.I):
        assert not re.match(r"\s*(javascript|data|vbscript):", attr, flags=re.I), (url, attr)
    assert len(re.findall(r"<script>", body)) <= 2, url  # the pages' own scripts only


def test_every_page_escapes_hostile_strings(client: Any) -> None:
    _login(client, "admin")
    for url in PAGES:
        r = client.get(url)
        assert r.status_code == 200, (url, r.status_code, r.text[:300])
        _no_markup(r.text, url)
        assert r.headers.get("x-frame-options") == "DENY" and "frame-ancestors 'none'" in r.headers[
            "content-security-policy"], url
    page = client.get("/version?name=team/base&number=1").text
    assert "javascript:alert(4)" in page  # shown as text, in a <code> or an unlinked box
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_team_token_never_sees_other(client: Any) -> None:
    _login(client, "team")
    for url in ("/", "/?q=other", "/?q=tag%3Do1", "/model?name=team/base", "/model?name=team/ft",
                "/version?name=team/ft&number=1", "/version?name=team/base&number=1",
                "/compare?ref=team/ft@1&to_ref=team/base@1"):
        r = client.get(url)
        assert r.status_code == 200, url
        assert "other/" not in r.text, url
    assert 'id="no-models"' in client.get("/?q=tag%3Do1").text  # other/x's metadata matches nothing
    for url in ("/model?name=other/x", "/model?name=other/nothing", "/version?name=other/x&number=1",
                "/version?name=other/x&number=99", "/compare?ref=other/x@1&to_ref=team/ft@1",
                "/compare?ref=team/ft@1&to_ref=other/x@1", "/compare?ref=team/ft@1&to_ref=other/nothing@1",
                "/audit", "/audit?model=other/x"):
        r = client.get(url, follow_redirects=False)
        assert r.status_code == 403, (url, r.status_code)
        assert "other/" not in r.text, url
    assert "restricted" in client.get("/version?name=team/ft&number=1").text
    assert "restricted" in client.get("/version?name=team/base&number=1").text  # its child other/kid


def test_revoked_token_cookie_is_refused_at_once(client: Any) -> None:
    _login(client, "gone")
    assert client.get("/model?name=team/ft").status_code == 200
    client.meta.revoke_token(client.ids["gone"], actor="t", host="t")
    r = client.get("/model?name=team/ft", follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")


@pytest.mark.parametrize("target", ["//evil.example", "/\\evil.example", "https:evil.example", "https://evil.example",
                                    "/\t/evil.example", "/\n/evil.example", "\\\\evil.example", "/%09/evil.example",
                                    "javascript:alert(1)", " /x", "///evil.example"])
def test_login_is_no_open_redirect(client: Any, target: str) -> None:
    client.cookies.clear()
    r = client.post("/login", data={"token": client.tokens["team"], "next": target}, headers=SAME_ORIGIN,
                    follow_redirects=False)
    location = r.headers["location"]
    assert location.startswith("/") and not location.startswith("//") and "\\" not in location, (target, location)
    assert not re.match(r"/[\t\n\r ]*/", location), location
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    page = client.get("/login?next=" + target.replace("\n", "%0A").replace("\t", "%09"))
    assert page.status_code == 200 and 'value="/"' in page.text or "evil" not in page.text


def test_cross_site_login_and_proxy_tls(client: Any) -> None:
    client.cookies.clear()
    r = client.post("/login", data={"token": client.tokens["team"], "next": "/"},
                    headers={"Sec-Fetch-Site": "cross-site"}, follow_redirects=False)
    assert r.status_code == 403 and "set-cookie" not in r.headers
    r = client.post("/login", data={"token": client.tokens["team"], "next": "/"},
                    headers={"X-Forwarded-Proto": "https", "Sec-Fetch-Site": "same-origin",
                             "Origin": "https://testserver"}, follow_redirects=False)
    assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()
