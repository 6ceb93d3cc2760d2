"""The HTTP transport of a remote registry: one pooled ``httpx.Client`` per ``Registry``.

* **Auth**: ``Authorization: Bearer <token>`` goes only to the server's own origin (scheme,
  host and port of ``PT2REG_URL``); a presigned S3 URL, or a redirect anywhere else, never
  sees it. The token is never logged, printed or put in an error message.
* **Retries**: a request that never reached the server (connection refused, connect timeout)
  is tried again, with exponential backoff and jitter; a 503, or a connection dropped after
  the request went out, is retried only for idempotent requests.
* **Errors**: the server answers every failure with ``{"error": {"type", "exit_code",
  "message", "hint", "scope"}}``; :func:`error_from_body` rebuilds the same ``RegistryError``
  subclass (a whitelist of ``registry.errors``' classes, else by exit code), so the CLI prints
  the line and exit code a direct store would. An unreachable server is one ``StoreError``
  line naming the URL and ``PT2REG_URL`` / ``--registry``.

    >>> client = HttpClient("http://127.0.0.1:8710", token="pt2r_...")   # doctest: +SKIP
    >>> client.get_json("/v1/whoami")["owner"]                            # doctest: +SKIP
    'ci'
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import httpx

from .. import errors
from ..config import normalize_url
from ..constants import ENV_URL, VERSION
from ..errors import NotAuthenticatedError, RegistryError, StoreError, UsageError, brief
from .wire import CLIENT_FEATURES, FEATURES_HEADER

__all__ = ["HttpClient", "error_from_body", "normalize_url", "same_origin", "without_query", "TIMEOUT", "ATTEMPTS"]

T = TypeVar("T")

#: connect, read (between two bytes), write and pool-wait limits, seconds
TIMEOUT = httpx.Timeout(connect=10.0, read=120.0, write=120.0, pool=60.0)
#: tries per request when the server cannot be reached (or answers 503, idempotent requests)
ATTEMPTS = 4
#: the first retry waits about this long; each next one twice as long (with jitter)
BACKOFF = 0.25
#: connections kept open to the server and the bucket (the blob transfers run in parallel)
POOL = httpx.Limits(max_connections=32, max_keepalive_connections=16)

#: errors that mean the request never reached the server: always safe to send again
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
#: errors after the request may have reached the server: sent again only when idempotent
_CUT_OFF = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout,
            httpx.WriteTimeout)
_IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS"}
_CONNECTION_HINT = f"check {ENV_URL} / --registry, and that the server is running"

#: the classes an error body may name (``RegistryError`` subclasses of ``registry.errors``)
_WHITELIST: dict[str, type[RegistryError]] = {
    name: cls for name in errors.__all__
    if isinstance(cls := getattr(errors, name, None), type) and issubclass(cls, RegistryError)}
#: an error body naming no known class is rebuilt by its exit code
_BY_EXIT_CODE: dict[int, type[RegistryError]] = {
    2: errors.UsageError, 3: errors.NotFoundError, 4: errors.IncompatibleError, 5: errors.IntegrityError,
    6: errors.ConflictError, 7: errors.AccessDeniedError}


def _origin(url: httpx.URL) -> tuple[str, str, int | None]:
    default = {"http": 80, "https": 443}.get(url.scheme)
    return url.scheme, url.host.lower(), url.port or default


def same_origin(a: str | httpx.URL, b: str | httpx.URL) -> bool:
    """True when both URLs have the same scheme, host and port (where a token may go)."""
    return _origin(httpx.URL(a)) == _origin(httpx.URL(b))


def error_from_body(status: int, body: Any, where: str) -> RegistryError:
    """The ``RegistryError`` an error answer stands for: the class it names when that is one of
    ``registry.errors``' (else the class of its exit code), with its message, hint and scope.
    A body that is not the server's error object is a ``StoreError`` naming the status."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict) or not isinstance(err.get("message"), str):
        if status == 401:
            return NotAuthenticatedError(f"the registry at {where} refused the request (HTTP 401)",
                                         hint="check PT2REG_TOKEN, --token-file or `pt2reg login`")
        if status == 403:
            return errors.AccessDeniedError(f"the registry at {where} refused the request (HTTP 403)")
        return StoreError(f"the registry at {where} answered HTTP {status} without an error body",
                          hint="is this URL a pt2reg server? check PT2REG_URL / --registry")
    message = err["message"]
    hint = err.get("hint") if isinstance(err.get("hint"), str) else None
    scope = err.get("scope") if isinstance(err.get("scope"), str) else None
    cls = _WHITELIST.get(str(err.get("type")))
    if cls is None:
        code = err.get("exit_code")
        cls = _BY_EXIT_CODE.get(code if isinstance(code, int) else 1, StoreError)
        if cls is errors.AccessDeniedError and status == 401:
            cls = NotAuthenticatedError
    return _build(cls, message, hint, scope)


def _build(cls: type[RegistryError], message: str, hint: str | None, scope: str | None) -> RegistryError:
    """An instance of ``cls`` carrying the server's message and hint (constructors differ:
    ``DatabaseOutdatedError`` fixes its own hint, ``InputValidationError`` takes none)."""
    kwargs: dict[str, Any] = {"hint": hint}
    if issubclass(cls, errors.AccessDeniedError):
        kwargs["scope"] = scope
    try:
        exc = cls(message, **kwargs)
    except TypeError:
        exc = cls(message)
        exc.hint = hint
        exc.args = (message if not hint else f"{message} ({hint})",)
    return exc


class HttpClient:
    """Requests to one registry server (``base_url``) and to the URLs it hands out.

    ``transport`` replaces the network (tests pass ``httpx.MockTransport`` or an ASGI
    transport); ``sleep`` replaces ``time.sleep`` between retries.
    """

    def __init__(self, base_url: str, token: str | None, *, transport: httpx.BaseTransport | None = None,
                 timeout: httpx.Timeout = TIMEOUT, attempts: int = ATTEMPTS, backoff: float = BACKOFF,
                 sleep: Callable[[float], None] = time.sleep, token_source: str | None = None) -> None:
        self.base_url = normalize_url(base_url)
        #: where the token came from (``PT2REG_TOKEN``, ``--token-file F``, a saved login), named
        #: when the server refuses it: never the token itself
        self.token_source = token_source
        if token is not None and not (token.isascii() and token.isprintable() and " " not in token):
            raise UsageError("the token given (PT2REG_TOKEN, --token-file or the login file) is not a registry token",
                             hint="use the secret `pt2reg token create` printed (pt2r_...)")
        self._token = token
        self._attempts = max(1, attempts)
        self._backoff = backoff
        self._sleep = sleep
        self._client = httpx.Client(transport=transport, timeout=timeout, limits=POOL, follow_redirects=False,
                                    headers={"User-Agent": f"pt2reg/{VERSION}",
                                             FEATURES_HEADER: ",".join(CLIENT_FEATURES)})
        self._closed = False

    def __repr__(self) -> str:  # never the token
        return f"HttpClient({self.base_url!r})"

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._client.close()

    # -- URLs -------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """The absolute URL of a server path (``/v1/...``)."""
        return self.base_url + path

    def _headers(self, url: str, extra: Mapping[str, str] | None) -> dict[str, str]:
        """``extra``, plus the bearer token when ``url`` is on the server's own origin; an
        ``Authorization`` given in ``extra`` for another origin is dropped too."""
        headers = {k: v for k, v in (extra or {}).items() if k.lower() != "authorization"}
        if self._token and same_origin(url, self.base_url):
            headers["Authorization"] = f"Bearer {self._token}"
        return headers

    # -- requests ---------------------------------------------------------------------------
    def send(self, method: str, url: str, *, params: Mapping[str, Any] | None = None, json: Any = None,
             content: Any = None, headers: Mapping[str, str] | None = None, stream: bool = False,
             idempotent: bool | None = None, ok: tuple[int, ...] = (),
             rewind: Callable[[], Any] | None = None) -> httpx.Response:
        """One request (``url`` absolute, or a path on the server), retried as the module says;
        an error answer (status >= 400 not in ``ok``) raises the ``RegistryError`` it stands
        for. Redirects are followed here, the token sent on to the server's origin only.
        ``rewind()`` gives a fresh ``content`` for a retry (a streamed upload body)."""
        target = url if "://" in url else self.url(url)
        method = method.upper()
        if idempotent is None:
            idempotent = method in _IDEMPOTENT
        for attempt in range(1, self._attempts + 1):
            if attempt > 1 and rewind is not None:
                content = rewind()
            try:
                response = self._follow(method, target, params=params, json=json, content=content,
                                        headers=headers, stream=stream)
            except _NOT_SENT as exc:
                if attempt == self._attempts:
                    raise self._unreachable(target, exc) from exc
            except _CUT_OFF as exc:
                if not idempotent and same_origin(target, self.base_url):
                    raise StoreError(f"the connection to the registry at {self.base_url} broke during {method} "
                                     f"{httpx.URL(target).path}: {_reason(exc)}",
                                     hint="the change may have been made: check (pt2reg show / list) before "
                                          "trying again") from exc
                if attempt == self._attempts:
                    raise self._unreachable(target, exc) from exc
            except httpx.HTTPError as exc:
                raise self._unreachable(target, exc) from exc
            else:
                if response.status_code == 503 and idempotent and attempt < self._attempts:
                    response.close()
                elif response.status_code >= 400 and response.status_code not in ok:
                    raise self._error(response, target)
                else:
                    return response
            self._sleep(self._backoff * (2 ** (attempt - 1)) * (0.5 + random.random()))
        raise AssertionError("unreachable")  # the loop returns or raises

    def _follow(self, method: str, url: str, *, params: Mapping[str, Any] | None, json: Any, content: Any,
                headers: Mapping[str, str] | None, stream: bool, hops: int = 5) -> httpx.Response:
        for _ in range(hops):
            request = self._client.build_request(method, url, params=params, json=json, content=content,
                                                 headers=self._headers(url, headers))
            response = self._client.send(request, stream=stream)
            if response.status_code not in (301, 302, 303, 307, 308) or "location" not in response.headers:
                return response
            response.close()
            url = str(response.url.join(response.headers["location"]))
            params = None  # the Location carries its own query
            if response.status_code == 303:
                method, json, content = "GET", None, None
        raise StoreError(f"the registry at {self.base_url} redirected {method} more than {hops} times")

    def _unreachable(self, url: str, exc: Exception) -> StoreError:
        if same_origin(url, self.base_url):
            return StoreError(f"cannot reach the registry at {self.base_url}: {_reason(exc)}",
                              hint=_CONNECTION_HINT)
        return StoreError(f"a blob transfer to {without_query(url)} failed: {_reason(exc)}",
                          hint="try again; the registry hands out a fresh URL each time")

    def _error(self, response: httpx.Response, url: str) -> RegistryError:
        try:
            if not response.is_stream_consumed:
                response.read()
            body = response.json()
        except (ValueError, httpx.HTTPError):
            body = None
        finally:
            response.close()
        if not same_origin(url, self.base_url):  # the bucket answered (a presigned URL)
            return StoreError(f"the blob store refused {response.request.method} {without_query(url)} "
                              f"(HTTP {response.status_code})",
                              hint="the presigned URL may have expired: try again")
        exc = error_from_body(response.status_code, body, self.base_url)
        if isinstance(exc, NotAuthenticatedError):
            sent = (f"the token sent came from {self.token_source}" if self._token else
                    "no token was sent (set PT2REG_TOKEN, pass --token-file or `pt2reg login`)")
            exc.hint = f"{sent}; {exc.hint}" if exc.hint else sent
        return exc

    # -- JSON helpers -----------------------------------------------------------------------
    def get_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._json(self.send("GET", path, params=_clean(params)), path)

    def post_json(self, path: str, body: Any = None, *, idempotent: bool = False) -> Any:
        return self._json(self.send("POST", path, json=body if body is not None else {}, idempotent=idempotent),
                          path)

    def put_json(self, path: str, body: Any) -> Any:
        return self._json(self.send("PUT", path, json=body), path)

    def delete_json(self, path: str, params: Mapping[str, Any] | None = None) -> Any:
        return self._json(self.send("DELETE", path, params=_clean(params)), path)

    def _json(self, response: httpx.Response, path: str) -> Any:
        try:
            return response.json()
        except ValueError as exc:
            raise StoreError(f"the registry at {self.base_url} sent a malformed answer to {path}",
                             hint="is this URL a pt2reg server? check PT2REG_URL / --registry") from exc
        finally:
            response.close()


def _clean(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """Query parameters without the None ones."""
    return None if params is None else {k: v for k, v in params.items() if v is not None}


def _reason(exc: Exception) -> str:
    return brief(exc) if str(exc).strip() else type(exc).__name__


def without_query(url: str) -> str:
    """A URL without its query (a presigned URL's query is its signature)."""
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}{parts.path}"
