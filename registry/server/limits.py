"""Limits on what a request may cost the server: body size, JSON shape, and slow clients.

:class:`LimitsMiddleware` (pure ASGI, outermost but for Starlette's error middleware) refuses a
body whose ``Content-Length`` is over the route's cap before reading a byte (413), counts the
bytes of bodies sent without one (413 as soon as they pass the cap), and gives every read of
the body a deadline: a client that sends nothing for ``idle_seconds``, or whose JSON body is
still not complete after ``body_seconds``, gets 408. Once the body is complete ``receive``
is passed through untouched (a streamed answer waits on it for the disconnect).

    >>> limits = ServerLimits(json_body=1 << 20)
    >>> limits.cap("POST", "/v1/publish") == limits.publish_body
    True
"""
from __future__ import annotations

import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import anyio

from ..errors import UsageError

__all__ = ["ServerLimits", "LimitsMiddleware", "BodyTooLarge", "ClientTooSlow",
           "LengthRequired", "parse_json_body"]

MiB = 1024 * 1024


@dataclass(frozen=True)
class ServerLimits:
    """Caps and timeouts (bytes, seconds). ``blob_body`` caps one uploaded blob: bundles cut
    members into pieces of at most 64 MiB and manifests stay under 16 MiB."""

    json_body: int = 1 * MiB           # any JSON body not listed below
    publish_body: int = 64 * MiB       # POST /v1/publish (carries the manifest)
    batch_body: int = 16 * MiB         # POST /v1/blobs/upload and /v1/blobs/download
    blob_body: int = 256 * MiB         # PUT /v1/blobs/{digest} (local store)
    json_depth: int = 64               # nesting of any JSON body
    batch_items: int = 100_000         # digests in one upload/download request
    idle_seconds: float = 30.0         # longest wait for the next piece of a body
    body_seconds: float = 120.0        # a whole JSON body (blob uploads: idle limit only)
    presign_seconds: int = 600         # presigned URL lifetime (S3 caps it at 900 anyway)

    def cap(self, method: str, path: str) -> int:
        """The body cap of a request."""
        if method == "PUT" and path.startswith("/v1/blobs/"):
            return self.blob_body
        if path == "/v1/publish":
            return self.publish_body
        if path in ("/v1/blobs/upload", "/v1/blobs/download"):
            return self.batch_body
        return self.json_body

    def deadline(self, method: str, path: str) -> float:
        """Seconds a whole body may take (a blob: unbounded, the idle limit still holds)."""
        return math.inf if method == "PUT" and path.startswith("/v1/blobs/") else self.body_seconds


class BodyTooLarge(UsageError):
    """413: the body is over the route's cap."""

    status = 413


class ClientTooSlow(UsageError):
    """408: the client stopped sending its body, or sent it too slowly."""

    status = 408


class LengthRequired(UsageError):
    """411: a blob upload without Content-Length."""

    status = 411


def _too_large(cap: int) -> BodyTooLarge:
    return BodyTooLarge(f"request body is larger than this route's limit of {cap} bytes",
                        hint="send less per request")


class LimitsMiddleware:
    """Body caps and read deadlines for every HTTP request (see the module docstring)."""

    def __init__(self, app: Any, limits: ServerLimits) -> None:
        self.app = app
        self.limits = limits

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        method, path = scope["method"], scope["path"]
        cap = self.limits.cap(method, path)
        declared = _content_length(scope)
        if declared is not None and declared > cap:
            await _refuse(send, _too_large(cap))
            return
        idle = self.limits.idle_seconds
        deadline = time.monotonic() + self.limits.deadline(method, path)
        received = 0
        complete = False

        async def limited_receive() -> dict:
            nonlocal received, complete
            if complete:
                return await receive()
            wait = min(idle, deadline - time.monotonic())
            if wait <= 0:
                raise ClientTooSlow("the request body took too long to arrive",
                                    hint="check the network, or send smaller requests")
            try:
                with anyio.fail_after(wait):
                    message = await receive()
            except TimeoutError:
                raise ClientTooSlow(f"the client sent no request body data for {wait:.0f} s",
                                    hint="check the network between the client and the server") from None
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > cap:
                    raise _too_large(cap)
                if not message.get("more_body", False):
                    complete = True
            else:
                complete = True
            return message

        await self.app(scope, limited_receive, send)


def _content_length(scope: dict) -> int | None:
    for key, value in scope.get("headers", ()):
        if key == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _refuse(send: Any, exc: UsageError) -> None:
    from .errors import error_body  # the one error shape

    body = json.dumps(error_body(exc)).encode("utf-8")
    await send({"type": "http.response.start", "status": getattr(exc, "status", 400),
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


def parse_json_body(raw: bytes, *, max_depth: int) -> dict[str, Any]:
    """The JSON object of a request body; UsageError when it is not one, or nests deeper than
    ``max_depth``."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except RecursionError:
        raise UsageError(f"request body nests deeper than {max_depth} levels") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise UsageError(f"request body must be a JSON object, not {type(value).__name__}")
    if _depth(value) > max_depth:
        raise UsageError(f"request body nests deeper than {max_depth} levels")
    if _SURROGATE_ESCAPE.search(raw) and _lone_surrogate(value):
        raise UsageError("request body holds a lone surrogate (a \\ud800-\\udfff escape alone), which is not "
                         "Unicode text", hint="send UTF-8 text")
    return value


#: how a surrogate is written in JSON (a pair is one character once parsed; one alone stays)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> bool:
    """Whether a string (or key) in a parsed JSON value is not Unicode text: its UTF-8 encoding
    fails (the value's nesting was checked first)."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _depth(value: Any) -> int:
    """Nesting depth of a parsed JSON value, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        deepest = max(deepest, level)
        stack.extend((child, level + 1) for child in children)
    return deepest
