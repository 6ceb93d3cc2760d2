"""``OciClient``: the OCI distribution spec (v1.1) over ``httpx``, for one repository.

What it does, and how it keeps the rules of ``registry.remote.http`` (the pt2reg server's client):

* **Auth**: anonymous first; a 401 from the registry's own origin with a ``Bearer`` challenge
  gets a token from the realm it names (with the login ``auth.find_credential`` found for this
  host, if any; an OAuth2 refresh token is exchanged by POST), a ``Basic`` challenge gets the
  login itself. The ``Authorization`` header goes to the registry's origin only: never to a
  redirect's target (registries redirect blob GETs to a bucket or CDN), never to a realm over
  plain HTTP unless the registry itself is plain HTTP (``--insecure`` or loopback).
* **Retries**: a request that never reached the registry, a 503 or a 429 (after its
  ``Retry-After``, capped) is tried again for idempotent requests, with backoff and jitter.
* **Errors**: the spec's ``{"errors": [{"code", "message"}]}`` as one ``RegistryError`` line of
  the CLI contract: 401 ``NotAuthenticatedError``, 403 ``AccessDeniedError`` (exit 7), the
  ``*_UNKNOWN`` codes and 404 ``NotFoundError`` (exit 3), ``DIGEST_INVALID``
  ``IntegrityError`` (exit 5), the rest ``StoreError``. The registry's words are clipped.
* **Uploads** (``upload_blob``): a blob another repository of the registry holds is mounted
  (``?mount=&from=``); a small one is sent in one ``PUT``; a large one in ``PATCH`` chunks,
  each hashed as it is read, resumed from the registry's ``Range`` after a broken connection.
  The last bytes are held back until the whole blob matched its digest, so a damaged source
  never completes an upload. Memory stays at one chunk per transfer.

``send`` has ``HttpClient.send``'s shape, so ``HttpBlobStore``'s verified, resumable downloads
run over it unchanged (``oci.blobs.OciBlobStore``).
"""
from __future__ import annotations

import hashlib
import random
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx

from ..constants import VERSION
from ..errors import (
    AccessDeniedError,
    IntegrityError,
    NotAuthenticatedError,
    NotFoundError,
    RegistryError,
    StoreError,
    UsageError,
    brief,
)
from .auth import Challenge, Credential, find_credential, parse_challenges
from .modelpack import IMAGE_INDEX, IMAGE_MANIFEST, MAX_MANIFEST_BYTES, Descriptor, parse_index
from .reference import OciReference

__all__ = ["OciClient", "UPLOAD_CHUNK", "MONOLITHIC_MAX", "TIMEOUT", "BlobSource"]

TIMEOUT = httpx.Timeout(connect=10.0, read=300.0, write=300.0, pool=120.0)
POOL = httpx.Limits(max_connections=32, max_keepalive_connections=16)
ATTEMPTS = 4
BACKOFF = 0.25
#: a 429's Retry-After is honoured up to this many seconds
MAX_RETRY_AFTER = 30.0
#: blobs up to this size go in one PUT; larger ones in PATCH chunks of ``UPLOAD_CHUNK``
MONOLITHIC_MAX = 64 * 1024 * 1024
UPLOAD_CHUNK = 64 * 1024 * 1024
#: bytes read from the source at a time while uploading
READ_PIECE = 1024 * 1024
#: chunked uploads resumed after a broken connection at most this many times per blob
RESUMES = 4
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)
_CUT_OFF = (httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadTimeout, httpx.WriteTimeout)
_IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE"}
_MANIFEST_ACCEPT = f"{IMAGE_MANIFEST}, {IMAGE_INDEX}"

#: reads ``size`` bytes of a blob from ``offset``, in pieces (what an upload sends)
BlobSource = Callable[[int, int], Iterator[bytes]]


def _origin(url: str | httpx.URL) -> tuple[str, str, int | None]:
    u = httpx.URL(url)
    return u.scheme, u.host.lower(), u.port or {"http": 80, "https": 443}.get(u.scheme)


class OciClient:
    """Requests to one repository of one OCI registry (``ref.host``/``ref.repository``)."""

    def __init__(self, ref: OciReference, *, insecure: bool = False, credential: Credential | None | bool = True,
                 transport: httpx.BaseTransport | None = None, timeout: httpx.Timeout = TIMEOUT,
                 attempts: int = ATTEMPTS, sleep: Callable[[float], None] = time.sleep) -> None:
        self.ref = ref
        self.insecure = insecure
        self.base_url = ref.base_url(insecure=insecure)
        self.repo_url = f"{self.base_url}/v2/{ref.repository}"
        # True: look the login up (lazily, once); None/False: anonymous; a Credential: that one
        self._credential: Credential | None | bool = credential
        if isinstance(credential, Credential) and credential.host.lower() != ref.host.lower():
            raise UsageError(f"a login for {credential.host} cannot be used for {ref.host}")
        self._attempts = max(1, attempts)
        self._sleep = sleep
        self._client = httpx.Client(transport=transport, timeout=timeout, limits=POOL, follow_redirects=False,
                                    headers={"User-Agent": f"pt2reg/{VERSION}"})
        self._authorization: str | None = None   # what goes to the registry's origin now
        self._lock = threading.Lock()

    def __repr__(self) -> str:   # never a secret
        return f"OciClient({self.base_url!r}, {self.ref.repository!r})"

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OciClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- credentials ----------------------------------------------------------------------
    @property
    def credential(self) -> Credential | None:
        if self._credential is True:
            self._credential = find_credential(self.ref.host, self.ref.repository)
        return self._credential if isinstance(self._credential, Credential) else None

    def _own(self, url: str | httpx.URL) -> bool:
        return _origin(url) == _origin(self.base_url)

    def _authenticate(self, response: httpx.Response, sent: str | None) -> bool:
        """Answer a 401's challenge; False when there is nothing to answer it with. ``sent``: the
        ``Authorization`` the refused request carried (another thread may have answered the
        same challenge meanwhile: then its answer is used, not a second token)."""
        challenges = parse_challenges(response.headers.get("www-authenticate", ""))
        with self._lock:
            if self._authorization != sent:
                return True
            for ch in challenges:
                if ch.scheme == "bearer" and "realm" in ch.params:
                    self._authorization = "Bearer " + self._token(ch)
                    return True
                if ch.scheme == "basic":
                    cred = self.credential
                    if cred is None or cred.basic is None or sent == cred.basic:
                        continue
                    self._authorization = cred.basic
                    return True
        return False

    def _token(self, ch: Challenge) -> str:
        realm = ch.params["realm"]
        try:
            realm_url = httpx.URL(realm)
        except Exception:   # noqa: BLE001 -- httpx's InvalidURL and friends: the realm is not a URL
            raise StoreError(f"the registry {self.ref.host} names a token realm that is not a URL") from None
        if realm_url.scheme not in ("http", "https") or \
                (realm_url.scheme == "http" and self.base_url.startswith("https:")):
            raise StoreError(f"the registry {self.ref.host} asks for a login at {realm_url.scheme}://"
                             f"{realm_url.host}, not over HTTPS: no credential is sent there",
                             hint="the registry's token service must use HTTPS")
        params: list[tuple[str, str | int | float | bool | None]] = []
        if "service" in ch.params:
            params.append(("service", ch.params["service"]))
        for scope in ch.params.get("scope", "").split(" "):
            if scope:
                params.append(("scope", scope))
        cred = self.credential
        headers: dict[str, str] = {}
        try:
            if cred is not None and cred.identity_token:
                form = {"grant_type": "refresh_token", "refresh_token": cred.identity_token, "client_id": "pt2reg",
                        **{k: str(v) for k, v in params if k == "service"},
                        "scope": " ".join(str(v) for k, v in params if k == "scope")}
                answer = self._client.post(realm_url, data=form)
            else:
                if cred is not None and cred.basic:
                    headers["Authorization"] = cred.basic
                answer = self._client.get(realm_url, params=params, headers=headers)
        except httpx.HTTPError as exc:
            raise StoreError(f"cannot reach the token service of {self.ref.host}: {brief(exc)}") from None
        if answer.status_code in (401, 403):
            raise self._login_refused(answer.status_code)
        if answer.status_code >= 400:
            raise StoreError(f"the token service of {self.ref.host} answered HTTP {answer.status_code}")
        try:
            body = answer.json()
            token = body.get("token") or body.get("access_token")
            if not isinstance(token, str) or not token or not token.isascii() or not token.isprintable():
                raise ValueError
        except ValueError:
            raise StoreError(f"the token service of {self.ref.host} sent no token") from None
        return token

    def _login_refused(self, status: int) -> RegistryError:
        cred = self.credential
        sent = f"the login sent came from {cred.source}" if cred is not None else \
            "no login was found (REGISTRY_AUTH_FILE, DOCKER_CONFIG or ~/.docker/config.json)"
        return NotAuthenticatedError(f"the registry {self.ref.host} refused the login (HTTP {status})",
                                     hint=f"{sent}; run `docker login {self.ref.host}` (or podman/skopeo login)")

    # -- requests -------------------------------------------------------------------------
    def url(self, path: str) -> str:
        return path if "://" in path else self.repo_url + path

    def send(self, method: str, url: str, *, params: Mapping[str, Any] | None = None, content: Any = None,
             headers: Mapping[str, str] | None = None, stream: bool = False, idempotent: bool | None = None,
             ok: tuple[int, ...] = (), rewind: Callable[[], Any] | None = None, json: Any = None) -> httpx.Response:
        """One request (``url`` absolute, or a path under ``/v2/<repository>``), authenticated,
        redirected and retried as the module says; an error answer not in ``ok`` raises."""
        target = self.url(url)
        method = method.upper()
        if idempotent is None:
            idempotent = method in _IDEMPOTENT
        authenticated = 0
        attempt = 0
        while True:
            attempt += 1
            if attempt > 1 and rewind is not None:
                content = rewind()
            sent = self._authorization
            try:
                response = self._follow(method, target, params=params, content=content, headers=headers,
                                        stream=stream)
            except _NOT_SENT as exc:
                if attempt >= self._attempts:
                    raise self._unreachable(exc) from None
            except _CUT_OFF as exc:
                if not idempotent or attempt >= self._attempts:
                    raise StoreError(f"the connection to the registry {self.ref.host} broke during {method} "
                                     f"{httpx.URL(target).path}: {type(exc).__name__}", hint="try again") from None
            except httpx.HTTPError as exc:
                raise self._unreachable(exc) from None
            else:
                status = response.status_code
                if status == 401 and self._own(response.url) and authenticated < 2 and \
                        self._authenticate(response, sent):
                    response.close()
                    authenticated += 1
                    attempt -= 1
                    if content is not None and not isinstance(content, (bytes, str)):
                        if rewind is None:
                            raise StoreError(f"the registry {self.ref.host} asked for a login in the middle of "
                                             f"{method} {httpx.URL(target).path}", hint="try again")
                        content = rewind()
                    continue
                if status in (429, 503) and idempotent and attempt < self._attempts:
                    wait = _retry_after(response)
                    response.close()
                    self._sleep(wait if wait is not None else BACKOFF * (2 ** (attempt - 1)) * (0.5 + random.random()))
                    continue
                if status >= 400 and status not in ok:
                    raise self._error(response, method, target)
                return response
            self._sleep(BACKOFF * (2 ** (attempt - 1)) * (0.5 + random.random()))

    def _follow(self, method: str, url: str, *, params: Mapping[str, Any] | None, content: Any,
                headers: Mapping[str, str] | None, stream: bool, hops: int = 5) -> httpx.Response:
        for _ in range(hops):
            h = {k: v for k, v in (headers or {}).items() if k.lower() != "authorization"}
            if self._authorization and self._own(url):
                h["Authorization"] = self._authorization
            request = self._client.build_request(method, url, params=params, content=content, headers=h)
            response = self._client.send(request, stream=stream)
            if response.status_code not in (301, 302, 303, 307, 308) or "location" not in response.headers:
                return response
            response.close()
            url = str(response.url.join(response.headers["location"]))
            params = None
            if response.status_code == 303 or method == "HEAD" and response.status_code in (301, 302):
                method, content = ("GET" if method != "HEAD" else "HEAD"), None
        raise StoreError(f"the registry {self.ref.host} redirected {method} more than {hops} times")

    def _unreachable(self, exc: Exception) -> StoreError:
        hint = "check the host and port, and that the registry is running"
        if self.base_url.startswith("https:"):
            hint += "; a registry without TLS needs --insecure (loopback ones are plain HTTP already)"
        return StoreError(f"cannot reach the OCI registry at {self.base_url}: {brief(exc)}", hint=hint)

    def _error(self, response: httpx.Response, method: str, url: str) -> RegistryError:
        status = response.status_code
        code, message = "", ""
        try:
            if not response.is_stream_consumed:
                response.read()
            errors = response.json().get("errors")
            if isinstance(errors, list) and errors and isinstance(errors[0], dict):
                code = str(errors[0].get("code", ""))[:64]
                message = " ".join(str(errors[0].get("message", "")).split())[:200]
        except (ValueError, AttributeError, httpx.HTTPError):
            pass
        finally:
            response.close()
        if not self._own(url) and not self._own(response.url):
            return StoreError(f"a blob transfer from {httpx.URL(url).host} failed (HTTP {status})", hint="try again")
        path = httpx.URL(url).path
        said = f" ({code}: {message})" if code or message else ""
        where = f"{self.ref.host}/{self.ref.repository}"
        if status == 401:
            return self._login_refused(401) if self.credential is not None else NotAuthenticatedError(
                f"the registry {self.ref.host} needs a login for {self.ref.repository}{said}",
                hint=f"run `docker login {self.ref.host}` or set REGISTRY_AUTH_FILE / DOCKER_CONFIG")
        if status == 403 or code == "DENIED":
            return AccessDeniedError(f"the registry {self.ref.host} denied {method} on {self.ref.repository}{said}",
                                     hint="the login lacks permission for this repository (push needs push rights)")
        if code in ("MANIFEST_UNKNOWN", "BLOB_UNKNOWN", "NAME_UNKNOWN", "BLOB_UPLOAD_UNKNOWN") or status == 404:
            return NotFoundError(f"{where}: {path.rsplit('/', 1)[-1]} not found{said}", what="oci", name=where)
        if code == "DIGEST_INVALID":
            return IntegrityError(f"the registry {self.ref.host} refused content that does not match its digest{said}")
        if status == 413 or code == "SIZE_INVALID":
            return UsageError(f"the registry {self.ref.host} refused {path.rsplit('/', 1)[-1]} as too large{said}",
                              hint="pass --max-layer-size with the registry's limit to be told before uploading")
        return StoreError(f"the registry {self.ref.host} answered HTTP {status} to {method} {path}{said}")

    # -- manifests ------------------------------------------------------------------------
    def get_manifest(self, reference: str) -> tuple[bytes, str]:
        """(bytes, media type) of a manifest, its size capped and, for a digest, its content
        checked against it (``IntegrityError``)."""
        response = self.send("GET", f"/manifests/{reference}", headers={"Accept": _MANIFEST_ACCEPT}, stream=True)
        try:
            data = _read_capped(response, MAX_MANIFEST_BYTES, f"manifest {reference}")
        finally:
            response.close()
        if reference.startswith("sha256:"):
            got = "sha256:" + hashlib.sha256(data).hexdigest()
            if got != reference:
                raise IntegrityError(f"the registry {self.ref.host} sent a manifest for {reference} whose digest is "
                                     f"{got}", hint="the registry or a proxy altered it: do not use this artifact")
        return data, response.headers.get("content-type", "").split(";")[0].strip()

    def put_manifest(self, reference: str, data: bytes, media_type: str = IMAGE_MANIFEST) -> httpx.Response:
        response = self.send("PUT", f"/manifests/{reference}", content=data, headers={"Content-Type": media_type})
        response.close()
        return response

    def manifest_exists(self, digest: str) -> bool:
        response = self.send("HEAD", f"/manifests/{digest}", headers={"Accept": _MANIFEST_ACCEPT}, ok=(404,))
        response.close()
        return response.status_code != 404

    # -- blobs ----------------------------------------------------------------------------
    def blob_size(self, digest: str) -> int | None:
        """The size of a blob the repository holds, or None."""
        response = self.send("HEAD", f"/blobs/{digest}", ok=(404,))
        response.close()
        if response.status_code == 404:
            return None
        try:
            return int(response.headers["content-length"])
        except (KeyError, ValueError):
            return None

    def read_blob(self, digest: str, size: int, max_size: int) -> bytes:
        """A small blob's verified content (the size the manifest gave, at most ``max_size``)."""
        if size > max_size:
            raise IntegrityError(f"blob {digest} of {self.ref.host}/{self.ref.repository} has {size} bytes, more "
                                 f"than the {max_size} allowed")
        response = self.send("GET", f"/blobs/{digest}", stream=True, headers={"Accept-Encoding": "identity"})
        try:
            data = _read_capped(response, size, f"blob {digest}")
        finally:
            response.close()
        if len(data) != size or "sha256:" + hashlib.sha256(data).hexdigest() != digest:
            raise IntegrityError(f"blob {digest} from {self.ref.host}/{self.ref.repository} does not match its digest",
                                 hint="the registry holds damaged content: do not use this artifact")
        return data

    def mount_blob(self, digest: str, source_repository: str) -> str | None:
        """Mount ``digest`` from another repository of this registry; None when mounted, else
        the upload session the registry opened instead (to upload into)."""
        response = self.send("POST", "/blobs/uploads/", params={"mount": digest, "from": source_repository},
                             idempotent=True, content=b"")
        response.close()
        if response.status_code == 201:
            return None
        return self._location(response)

    def upload_blob(self, digest: str, size: int, source: BlobSource, *, session: str | None = None,
                    progress: Callable[[int], None] | None = None, chunk: int = UPLOAD_CHUNK,
                    monolithic_max: int = MONOLITHIC_MAX) -> None:
        """Upload a blob read from ``source`` (verified against ``digest`` as it is read)."""
        if session is None:
            response = self.send("POST", "/blobs/uploads/", idempotent=True, content=b"")
            response.close()
            session = self._location(response)
        if size <= monolithic_max:
            self._put_whole(session, digest, size, source, progress)
        else:
            self._put_chunked(session, digest, size, source, progress, chunk)

    def _location(self, response: httpx.Response) -> str:
        loc = response.headers.get("location")
        if not loc:
            raise StoreError(f"the registry {self.ref.host} opened an upload without a Location")
        url = str(response.url.join(loc))
        if not self._own(url):
            raise StoreError(f"the registry {self.ref.host} sent an upload to another host ({httpx.URL(url).host})",
                             hint="uploads go to the registry itself: check the registry's configuration")
        return url

    def _put_whole(self, session: str, digest: str, size: int, source: BlobSource,
                   progress: Callable[[int], None] | None) -> None:
        def body() -> Iterator[bytes]:
            yield from _checked(source(0, size), digest, size, 0, hashlib.sha256(), progress, final=True)

        response = self.send("PUT", _with_query(session, digest=digest), content=body(), rewind=body,
                             headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)})
        response.close()

    def _put_chunked(self, session: str, digest: str, size: int, source: BlobSource,
                     progress: Callable[[int], None] | None, chunk: int) -> None:
        marks = {0: hashlib.sha256()}     # offset -> the hash of the bytes before it (resume points)
        offset, resumes = 0, 0
        while offset < size:
            start, n = offset, min(chunk, size - offset)
            holder: dict[str, Any] = {}

            def body(start: int = start, n: int = n, holder: dict[str, Any] = holder) -> Iterator[bytes]:
                holder["state"] = state = marks[start].copy()
                return _checked(source(start, n), digest, size, start, state, progress, final=start + n == size,
                                expect=n)

            try:
                response = self.send("PATCH", session, content=body(), rewind=body, idempotent=False, headers={
                    "Content-Type": "application/octet-stream", "Content-Length": str(n),
                    "Content-Range": f"{start}-{start + n - 1}"})
            except StoreError:
                resumes += 1
                if resumes > RESUMES:
                    raise
                offset = self._committed(session)
                if offset > size:
                    raise
                if offset not in marks:   # the registry kept part of a chunk: hash up to where it stopped
                    below = max(m for m in marks if m <= offset)
                    state = marks[below].copy()
                    for data in source(below, offset - below):
                        state.update(data)
                    marks[offset] = state
                continue
            response.close()
            session = self._location(response)
            marks[start + n] = holder["state"]
            offset = start + n
        response = self.send("PUT", _with_query(session, digest=digest), content=b"",
                             headers={"Content-Length": "0"})
        response.close()

    def _committed(self, session: str) -> int:
        """The next byte the registry expects of an upload session (its ``Range: 0-N``)."""
        response = self.send("GET", session, ok=(404,))
        response.close()
        if response.status_code == 404:
            raise StoreError(f"the registry {self.ref.host} forgot an upload in progress", hint="push again")
        rng = response.headers.get("range", "")
        try:
            return int(rng.split("-", 1)[1]) + 1 if "-" in rng else 0
        except ValueError:
            return 0

    # -- referrers ------------------------------------------------------------------------
    def referrers(self, digest: str) -> list[Descriptor]:
        """The manifests whose ``subject`` is ``digest``: the referrers API, else the tag schema
        (``sha256-<hex>``, an image index) registries without it are given."""
        response = self.send("GET", f"/referrers/{digest}", ok=(404, 400, 405), stream=True,
                             headers={"Accept": IMAGE_INDEX})
        try:
            if response.status_code == 200 and \
                    response.headers.get("content-type", "").split(";")[0].strip() == IMAGE_INDEX:
                return parse_index(_read_capped(response, MAX_MANIFEST_BYTES, "referrers"), "the referrers list")
        finally:
            response.close()
        return self._fallback_index(digest)

    def _fallback_index(self, digest: str) -> list[Descriptor]:
        try:
            data, _ = self.get_manifest(_fallback_tag(digest))
        except NotFoundError:
            return []
        return parse_index(data, "the referrers tag")

    def add_referrer(self, subject: str, data: bytes, artifact_type: str, annotations: Mapping[str, str]) -> str:
        """Push a referrer manifest (its ``subject`` is ``subject``); a registry that does not
        say it indexed it (no ``OCI-Subject`` header) gets the tag schema's index updated."""
        desc = Descriptor(IMAGE_MANIFEST, "sha256:" + hashlib.sha256(data).hexdigest(), len(data),
                          dict(annotations), artifact_type)
        response = self.put_manifest(desc.digest, data)
        if response.headers.get("oci-subject") == subject:
            return desc.digest
        current = self._fallback_index(subject)
        if any(d.digest == desc.digest for d in current):
            return desc.digest
        from ..digests import canonical_json

        index = canonical_json({"schemaVersion": 2, "mediaType": IMAGE_INDEX,
                                "manifests": [d.to_json() for d in current] + [desc.to_json()]})
        self.put_manifest(_fallback_tag(subject), index, IMAGE_INDEX)
        return desc.digest


def _with_query(url: str, **params: str) -> str:
    """``url`` with ``params`` added to its query (an upload session's URL carries its own state
    there, which httpx's ``params=`` would replace)."""
    u = httpx.URL(url)
    return str(u.copy_merge_params(params))


def _fallback_tag(digest: str) -> str:
    return digest.replace(":", "-", 1)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after", "")
    try:
        return min(MAX_RETRY_AFTER, max(0.0, float(value)))
    except ValueError:
        return None


def _read_capped(response: httpx.Response, limit: int, what: str) -> bytes:
    out = bytearray()
    for data in response.iter_bytes():
        out += data
        if len(out) > limit:
            raise IntegrityError(f"the registry sent more than {limit} bytes for {what}")
    return bytes(out)


def _checked(pieces: Iterator[bytes], digest: str, size: int, start: int, state: Any,
             progress: Callable[[int], None] | None, *, final: bool, expect: int | None = None) -> Iterator[bytes]:
    """``pieces`` passed on, hashed into ``state``; with ``final``, the last piece is held back
    until the whole blob matched ``digest`` (wrong bytes never complete an upload)."""
    want = size - start if expect is None else expect
    got = 0
    held: bytes | None = None
    for data in pieces:
        if not data:
            continue
        got += len(data)
        if got > want:
            raise IntegrityError(f"blob {digest}: the source holds more bytes than the {size} recorded")
        state.update(data)
        if held is not None:
            yield held
            if progress is not None:
                progress(len(held))
        held = bytes(data)
    if got != want:
        raise IntegrityError(f"blob {digest}: the source ended at byte {start + got} of {size}",
                             hint="the registry's store is damaged: run `pt2reg audit --verify`")
    if final and "sha256:" + state.hexdigest() != digest:
        raise IntegrityError(f"blob {digest} does not match its digest in this registry's store",
                             hint="the store is damaged: run `pt2reg audit --verify`; nothing was completed")
    if held is not None:
        yield held
        if progress is not None:
            progress(len(held))
