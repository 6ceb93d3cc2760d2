"""The web UI's pure view logic (compare, lineage layout) and its pages in process (ASGI):
escaping, the login cookie, no open redirect, no name leaked by a 403."""
from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from registry.format.manifest import Manifest
from registry.server.web.compare import compare_manifests, shape_text
from registry.server.web.lineage import layout
from registry.store.records import LineageEdge, LineageNode
from tests.store_calls import publish
from tests.unit.test_manifest import minimal


def _manifest(edit: Any = None) -> Manifest:
    raw = copy.deepcopy(minimal())
    if edit:
        edit(raw)
    return Manifest.from_raw(raw)


def test_compare_names_the_changed_dim_ops_and_bytes() -> None:
    def widen(raw: dict) -> None:
        prog = raw["programs"]["model"]
        prog["inputs"][0]["shape"][0] = {"min": 1, "max": 64, "expr": "s0", "dim": "b"}
        prog["outputs"].append({"name": "z", "dtype": "int64", "shape": [2], "path": "out[1]"})
        prog["required_ops"] = [{"name": "my::op", "overload": "default", "target": "torch.ops.my.op.default",
                                 "schema": None}]
        raw["members"].append({"path": "samples/s.safetensors", "sha256": "1" * 64, "size": 5, "role": "sample"})

    a, b = _manifest(), _manifest(widen)
    c = compare_manifests(a, b)
    x = next(t for t in c.tensors if t.name == "x")
    assert (x.change, x.before, x.after) == ("shape", "float32 [b 1..8, 4]", "float32 [b 1..64, 4]")
    assert x.dims == ("0: b 1..8 -> b 1..64",)
    assert [(t.name, t.change) for t in c.tensors if t.side == "output"] == [("z", "added")]
    assert [(o.op, o.change) for o in c.ops] == [("my::op.default", "added")]
    assert (c.chunks.shared_bytes, c.chunks.new_bytes, c.chunks.removed_bytes) == (10, 5, 0)
    assert [m.change for m in c.members] == ["same", "added"]
    same = compare_manifests(a, a)
    assert same.same_digest and not same.signature_changed and not same.ops
    assert shape_text(None) == "?"


def _node(name: str, number: int, depth: int, digest: str, parents: tuple[str, ...] = (),
          status: str = "active", facts: tuple[LineageEdge, ...] = ()) -> LineageNode:
    edges = [LineageEdge("parent", "p", d) for d in parents] + list(facts)
    return LineageNode(name, number, digest, status, depth, edges=edges)


def test_lineage_layout_keeps_same_digest_versions_apart_and_restricted_unlinked() -> None:
    d1, d2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64
    me = _node("team/distil", 1, 0, d2, parents=(d2,), facts=(LineageEdge("dataset", "s3://data"),))
    ancestors = [me, _node("team/ft", 1, 1, d2, parents=(d1, d1)), _node("team/base", 1, 2, d1),
                 LineageNode("restricted", 0, d1, "restricted", 2)]
    g = layout(ancestors, [me])
    titles = {b.title: b for b in g.boxes}
    assert set(titles) == {"team/distil@1", "team/ft@1", "team/base@1", "restricted", "dataset"}
    assert titles["restricted"].href is None and titles["dataset"].href is None
    assert titles["team/base@1"].href == "/version?name=team%2Fbase&number=1"
    assert titles["team/base@1"].x < titles["team/ft@1"].x < titles["team/distil@1"].x
    # base -> ft, restricted -> ft, ft -> distil, dataset -> distil
    assert len(g.arrows) == 4
    assert g.width >= max(b.x for b in g.boxes) + g.box_w and g.height >= max(b.y for b in g.boxes) + g.box_h


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from fastapi.testclient import TestClient

    from registry.config import Settings
    from registry.server import create_app

    home: Path = tmp_path_factory.mktemp("web")
    app = create_app(Settings.resolve(home=str(home), env={}))
    meta = app.state.registry.meta
    text = _manifest(lambda raw: raw["metadata"].update(note="<script>alert(1)</script>")).canonical.decode()
    digest = Manifest.from_bytes(text.encode()).digest
    for name in ("team/m", "other/x"):
        publish(meta, name, digest, text, 10, [("sha256:" + "0" * 64, 10)], actor="ana", host="h",
                     metadata={"note": "<script>alert(1)</script>"})
    tokens = {who: meta.create_token(who, scopes, expires_at=None, actor="t", host="t")[1]
              for who, scopes in (("admin", ["admin"]), ("team", ["model:team/*:pull"]))}
    with TestClient(app, base_url="http://testserver") as c:
        c.tokens = tokens
        yield c


#: what a browser sends with the login form of the TestClient's own origin (``pages.origin``)
SAME_ORIGIN = {"Origin": "http://testserver"}


def _login(client: Any, who: str) -> Any:
    client.cookies.clear()
    return client.post("/login", data={"token": client.tokens[who], "next": "/model?name=team/m"},
                       headers=SAME_ORIGIN, follow_redirects=False)


def test_login_sets_an_httponly_strict_cookie_and_redirects_only_locally(client: Any) -> None:
    r = _login(client, "admin")
    assert r.status_code == 303 and r.headers["location"] == "/model?name=team/m"
    cookie = r.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/" in cookie
    for target in ("https://evil.example/", "//evil.example/x", "/\\\\evil.example"):
        client.cookies.clear()
        r = client.post("/login", data={"token": client.tokens["admin"], "next": target}, headers=SAME_ORIGIN,
                        follow_redirects=False)
        assert r.headers["location"] == "/", target
    client.cookies.clear()
    r = client.post("/login", data={"token": "pt2r_" + "x" * 43}, headers=SAME_ORIGIN, follow_redirects=False)
    assert r.status_code == 401 and "set-cookie" not in r.headers
    assert client.get("/", follow_redirects=False).headers["location"] == "/login?next=%2F"


def test_pages_escape_what_the_registry_holds(client: Any) -> None:
    _login(client, "admin")
    for url in ("/", "/version?name=team/m&number=1"):
        body = client.get(url).text
        assert "<script>alert(1)</script>" not in body and "&lt;script&gt;alert(1)&lt;/script&gt;" in body, url


def test_the_api_takes_no_cookie_and_pages_take_no_bearer(client: Any) -> None:
    _login(client, "admin")
    assert client.get("/v1/models").status_code == 401
    client.cookies.clear()
    r = client.get("/model?name=team/m", headers={"Authorization": f"Bearer {client.tokens['admin']}"},
                   follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"].startswith("/login")


def test_a_forbidden_model_is_a_403_page_that_names_nothing(client: Any) -> None:
    _login(client, "team")
    assert "other/x" not in client.get("/").text
    for url in ("/model?name=other/x", "/model?name=other/absent", "/version?name=other/x&number=1",
                "/compare?ref=team/m@1&to_ref=other/x@1"):
        r = client.get(url)
        assert r.status_code == 403, url
        assert not re.search(r"other/(x|absent)", r.text), url
    assert client.get("/model?name=team/absent").status_code == 404
    assert client.get("/audit").status_code == 403


def test_the_audit_page_filters_by_actor_action_and_time(client: Any) -> None:
    _login(client, "admin")

    def rows(query: str) -> list[str]:
        page = client.get("/audit?" + query)
        assert page.status_code == 200 and "chain verified" in page.text
        return re.findall(r'<tr class="event"><td>(\d+)</td>', page.text)

    assert len(rows("actor=ana&action=publish")) == 2
    assert rows("actor=ana&action=publish&model=team/m") == ["1"]
    assert rows("action=publish&until=2000-01-01T00:00:00Z") == []
    assert len(rows("action=publish&since=2000-01-01T00:00:00Z")) == 2
    assert rows("actor=nobody") == []
    assert client.get("/audit?since=yesterday").status_code == 400


def test_the_audit_page_folds_hashes_and_keeps_each_time_on_one_line(client: Any) -> None:
    """Readable: a hash is shown by its first digits with the whole value in a title (hover,
    copy), a time is one ``<time>`` token (ISO 8601 UTC, the CLI's form) that the stylesheet
    keeps from wrapping, with the exact value in its ``datetime``."""
    _login(client, "admin")
    page = client.get("/audit").text
    cells = re.findall(r'<td class="mono"><span class="hash" title="([0-9a-f]{64})">([0-9a-f]{10})…</span></td>', page)
    events = page.count('<tr class="event">')
    assert events >= 2 and len(cells) == events and all(full.startswith(short) for full, short in cells)
    visible = re.sub(r"<[^>]*>", " ", page)  # the text a reader sees, attributes left out
    assert not re.search(r"[0-9a-f]{40}", visible)
    times = re.findall(r'<time datetime="([^"]+)" title="[^"]+">([^<]+)</time>', page)
    assert len(times) == events
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", exact) and shown == exact[:19] + "Z"
               for exact, shown in times)
    assert "time{white-space:nowrap}" in page and ".hash{white-space:nowrap" in page


def test_a_digest_in_an_event_s_details_is_folded_too() -> None:
    from registry.server.web.render import _env

    digest = "sha256:" + "ab" * 32
    html = _env().from_string("{{ v|fold }} {{ w|fold }} {{ x|fold }}").render(v=digest, w="team/m@2", x="<b>")
    assert html == f'<span class="hash" title="{digest}">sha256:{"ab" * 6}…</span> team/m@2 &lt;b&gt;'


def test_the_compare_page_heads_the_io_signature_so(client: Any) -> None:
    """Inputs and outputs are the program's I/O signature, never to be read as a cryptographic one."""
    _login(client, "admin")
    page = client.get("/compare?ref=team/m@1&to_ref=other/x@1")
    assert page.status_code == 200
    assert re.findall(r"<h2[^>]*>([^<]*)</h2>", page.text)[0] == "I/O signature"
    assert not re.search(r"<h2[^>]*>\s*Signatures?\s*<", page.text)
