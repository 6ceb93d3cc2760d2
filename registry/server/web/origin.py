"""Whether a form POST comes from this registry's own pages (login and logout CSRF).

A page on another site (or a sibling subdomain) can submit a form to ``/login`` with the
attacker's token, logging the victim's browser in as the attacker, or to ``/logout``. The
cookie's ``SameSite=Strict`` does not help there: the login sets the cookie, it does not
need one. So both forms require the browser to say the POST comes from this registry:

- the registry's origin is the ``--public-url``'s (scheme, host, port) when the server has one:
  behind a reverse proxy or load balancer, that is the name browsers use; otherwise the
  request's own: the scheme from the first ``X-Forwarded-Proto`` value when present (as for the
  cookie's ``Secure`` flag; a page cannot make a browser send that header cross-origin) or the
  connection's, and the ``Host`` header. Behind a proxy that rewrites ``Host`` or terminates
  TLS without ``X-Forwarded-Proto``, set ``--public-url``;
- the ``Origin`` header must equal it (``Origin: null``, sent by sandboxed frames and some
  privacy settings, does not); without an ``Origin``, the ``Referer``'s origin must (the pages
  send ``Referrer-Policy: same-origin``, so the registry's own forms carry one and nothing
  leaves for other sites); with neither, the POST is refused;
- a ``Sec-Fetch-Site`` header, when the browser sends one, must be ``same-origin``.

Default ports are implied (``http://h`` is ``http://h:80``); host names compare without case.

    >>> foreign_post("http://reg:8710", {"origin": "http://reg:8710"}) is None
    True
    >>> foreign_post("https://reg.example", {"origin": "https://evil.example"})
    'its Origin is https://evil.example, not https://reg.example'
"""
from __future__ import annotations

from collections.abc import Mapping
from urllib.parse import urlsplit

__all__ = ["own_origin", "foreign_post", "origin_of"]

_DEFAULT_PORTS = {"http": 80, "https": 443}


def origin_of(url: str) -> str | None:
    """``scheme://host[:port]`` of an absolute http(s) URL, lower case, default port left out;
    None for anything else (``null``, a relative URL, another scheme).

    >>> origin_of("HTTPS://Reg.Example:443/login?next=/")
    'https://reg.example'
    """
    try:
        parts = urlsplit(url.strip())
        port = parts.port
    except ValueError:
        return None
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    if scheme not in _DEFAULT_PORTS or not host or parts.username is not None:
        return None
    shown = f"[{host}]" if ":" in host else host
    return f"{scheme}://{shown}" + (f":{port}" if port and port != _DEFAULT_PORTS[scheme] else "")


def own_origin(public_url: str | None, scheme: str, headers: Mapping[str, str]) -> str | None:
    """The registry's origin for a request (see the module docstring); None when the request
    gives no usable ``Host``."""
    if public_url:
        return origin_of(public_url)
    forwarded = headers.get("x-forwarded-proto", "").split(",")[0].strip().lower()
    host = headers.get("host", "")
    if not host or any(c in host for c in "/\\@?# "):
        return None
    return origin_of(f"{forwarded if forwarded in _DEFAULT_PORTS else scheme}://{host}/")


def foreign_post(own: str | None, headers: Mapping[str, str]) -> str | None:
    """Why a POST with these (lower-case keyed) headers is not from the registry's own pages,
    or None when it is."""
    if own is None:
        return "the request names no host this registry can check it against"
    site = headers.get("sec-fetch-site")
    if site is not None and site != "same-origin":
        return f"the browser says it comes from another site (Sec-Fetch-Site: {site[:40]})"
    origin = headers.get("origin")
    if origin is not None:
        if origin_of(origin) != own:
            return f"its Origin is {origin[:100]}, not {own}"
        return None
    referer = headers.get("referer")
    if referer is None:
        return "it carries neither an Origin nor a Referer header"
    if origin_of(referer) != own:
        return f"its Referer is not a page of {own}"
    return None
