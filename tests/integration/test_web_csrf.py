"""Issue 41 (C): login and logout CSRF against a real ``pt2reg serve``. An attacker's page
submits the login form with the attacker's own (valid) token, or the logout form, from another
site, a sibling origin (other port, other scheme), a sandboxed frame (``Origin: null``), or with
no fetch metadata at all. Each is a 403 page saying why, and nothing changed: no cookie set, the
victim's session still works. The registry's own forms (same-origin ``Origin``, or a
same-origin ``Referer`` without one) still log in and out; behind a proxy, ``--public-url``
is the origin that counts (``registry.server.web.origin``).
"""
from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.services_server import make_token, registry_server

pytestmark = [pytest.mark.integration]

PUBLIC = "https://registry.example"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("csrf")
    db, store = f"sqlite:///{tmp / 'r.db'}", f"file://{tmp / 'store'}"
    with registry_server(db, store, log_dir=tmp / "a") as plain, \
            registry_server(db, store, log_dir=tmp / "b", extra_args=["--public-url", PUBLIC]) as proxied:
        yield {"plain": plain.url, "proxied": proxied.url, "victim": make_token(db, "victim", ["admin"]),
               "attacker": make_token(db, "attacker", ["model:attacker/*:pull"])}


def _login(base: str, token: str, headers: dict[str, str], cookies: dict[str, str] | None = None) -> httpx.Response:
    with httpx.Client(base_url=base, cookies=cookies, timeout=60) as client:
        return client.post("/login", data={"token": token, "next": "/"}, headers=headers, follow_redirects=False)


def _refused(r: httpx.Response) -> None:
    assert r.status_code == 403, (r.status_code, r.text[:300])
    assert "set-cookie" not in r.headers, r.headers
    assert "refused:" in r.text


def _foreign(base: str) -> list[dict[str, str]]:
    host_port = base.split("://", 1)[1]
    host, port = host_port.rsplit(":", 1)
    return [{"Origin": "https://evil.example"},
            {"Origin": "null"},
            {"Origin": f"http://{host}:{int(port) + 1}"},                   # another port: another origin
            {"Origin": f"https://{host_port}"},                             # another scheme
            {"Origin": f"http://{host_port}.evil.example"},
            {"Origin": f"http://evil.example/{host_port}"},
            {"Origin": "https://evil.example", "Referer": f"{base}/login"},  # Origin wins over Referer
            {"Referer": "https://evil.example/page"},
            {"Referer": f"http://{host_port}@evil.example/login"},
            {"Referer": "/login"},
            {},                                                             # no fetch metadata at all
            {"Sec-Fetch-Site": "same-site", "Origin": base},                # a sibling subdomain's page
            {"Sec-Fetch-Site": "cross-site", "Origin": base}]


def test_login_from_anywhere_but_the_registrys_own_pages_is_refused(servers: dict[str, Any]) -> None:
    base = servers["plain"]
    for headers in _foreign(base):
        r = _login(base, servers["attacker"], headers)
        _refused(r)
    assert "Origin is https://evil.example, not " + base in _login(base, servers["attacker"], _foreign(base)[0]).text


def test_the_registrys_own_login_and_logout_still_work(servers: dict[str, Any]) -> None:
    base = servers["plain"]
    for headers in ({"Origin": base}, {"Referer": f"{base}/login?next=/"}, {"Origin": base, "Sec-Fetch-Site": "same-origin"}):
        r = _login(base, servers["victim"], headers)
        assert r.status_code == 303 and "pt2reg_session=" in r.headers["set-cookie"], (headers, r.text[:200])
    # behind a TLS proxy that says so (X-Forwarded-Proto), the https origin is the registry's
    r = _login(base, servers["victim"], {"X-Forwarded-Proto": "https", "Origin": base.replace("http:", "https:")})
    assert r.status_code == 303 and "secure" in r.headers["set-cookie"].lower()


def test_logout_from_another_page_leaves_the_session_alone(servers: dict[str, Any]) -> None:
    base = servers["plain"]
    with httpx.Client(base_url=base, timeout=60) as client:
        r = client.post("/login", data={"token": servers["victim"]}, headers={"Origin": base}, follow_redirects=False)
        assert r.status_code == 303
        for headers in _foreign(base):
            r = client.post("/logout", headers=headers, follow_redirects=False)
            _refused(r)
            assert client.get("/", follow_redirects=False).status_code == 200, headers  # still logged in
        r = client.post("/logout", headers={"Origin": base}, follow_redirects=False)
        assert r.status_code == 303 and "pt2reg_session=" in r.headers["set-cookie"]  # cleared
        client.cookies.clear()
        assert client.get("/", follow_redirects=False).status_code == 303  # to the login form


def test_with_a_public_url_only_its_origin_counts(servers: dict[str, Any]) -> None:
    base = servers["proxied"]
    for headers in ({"Origin": base}, {"Referer": f"{base}/login"}, {"Origin": "http://registry.example"},
                    {"Origin": PUBLIC, "Sec-Fetch-Site": "cross-site"}, {"Referer": "https://evil.example/"},
                    {"Origin": base, "Host": "registry.example"}):
        _refused(_login(base, servers["victim"], headers))
    for headers in ({"Origin": PUBLIC}, {"Origin": PUBLIC + ":443"}, {"Referer": f"{PUBLIC}/login?next=/"}):
        r = _login(base, servers["victim"], headers)
        assert r.status_code == 303 and "pt2reg_session=" in r.headers["set-cookie"], (headers, r.text[:200])


def test_a_refused_login_says_why_in_one_line(servers: dict[str, Any]) -> None:
    r = _login(servers["plain"], servers["attacker"], {"Origin": "null"})
    _refused(r)
    assert "log in from this registry&#39;s own login page (its Origin is null" in r.text
