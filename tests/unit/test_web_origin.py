"""``registry.server.web.origin``: which form POSTs come from the registry's own pages."""
from __future__ import annotations

import pytest

from registry.server.web.origin import foreign_post, origin_of, own_origin


def test_origins_are_compared_normalized() -> None:
    assert origin_of("HTTP://Reg:80/x") == "http://reg" == origin_of("http://reg")
    assert origin_of("https://[::1]:8443/") == "https://[::1]:8443"
    for bad in ("null", "/login", "ftp://reg", "http://u@reg/", "http://reg:99999/", "javascript:alert(1)"):
        assert origin_of(bad) is None, bad


def test_the_registrys_origin_is_the_public_url_else_the_request_own() -> None:
    assert own_origin("https://reg.example/", "http", {"host": "10.0.0.5:8710"}) == "https://reg.example"
    assert own_origin(None, "http", {"host": "reg:8710"}) == "http://reg:8710"
    assert own_origin(None, "http", {"host": "reg", "x-forwarded-proto": "https, http"}) == "https://reg"
    assert own_origin(None, "http", {"host": "reg", "x-forwarded-proto": "gopher"}) == "http://reg"
    for host in ("", "evil.example/x", "a@b", "reg\\x"):
        assert own_origin(None, "http", {"host": host}) is None, host


@pytest.mark.parametrize("headers, ok", [
    ({"origin": "http://reg"}, True),
    ({"referer": "http://reg/login?next=/"}, True),
    ({"origin": "http://reg", "sec-fetch-site": "same-origin"}, True),
    ({"origin": "null"}, False),
    ({"origin": "http://reg.evil"}, False),
    ({"origin": "https://reg"}, False),
    ({"origin": "http://evil", "referer": "http://reg/"}, False),
    ({"referer": "http://evil/"}, False),
    ({}, False),
    ({"origin": "http://reg", "sec-fetch-site": "same-site"}, False),
])
def test_a_post_is_ours_only_with_a_same_origin_origin_or_referer(headers: dict, ok: bool) -> None:
    assert (foreign_post("http://reg", headers) is None) is ok
    assert foreign_post(None, headers) is not None
