"""Webhook delivery (any replica, each delivery sent by exactly one) and the webhook routes.

Outbox rows are written with the audit event they report (``registry.store.outbox``). Every
server process runs one :class:`Background` thread that, every ``PT2REG_WEBHOOK_POLL``
seconds (default 1), signs the newest audit head when the chain grew
(``registry.server.audit_head``) and looks up which webhooks have deliveries due.

Each webhook (endpoint) is a queue of its own, worked by a :class:`_Lane`: at most
``PT2REG_WEBHOOK_CONCURRENCY`` deliveries to it at once (default 4), each worker claiming that
webhook's next due row itself (a conditional UPDATE only one replica can win, held for a lease
longer than one delivery can take), POSTing it with the Standard Webhooks headers
``webhook-id``, ``webhook-timestamp`` and ``webhook-signature: v1,<base64 HMAC-SHA256 of
"{id}.{timestamp}.{body}">`` keyed with the secret's bytes, and logging the attempt (status
code or error, a short excerpt of the response, duration). So a slow or dead receiver holds
only its own queue: another endpoint's deliveries start within one poll of being due, never
behind it. A failure is retried after ``PT2REG_WEBHOOK_RETRY_BASE`` x 2^(attempt-1) seconds
(default 10, capped at ``PT2REG_WEBHOOK_RETRY_MAX``, default 3600), up to 12 attempts.

Before each attempt the target is resolved and checked (``registry.access.webhook_targets``: no
loopback, private, link-local or other internal address unless ``PT2REG_WEBHOOK_ALLOW``
names it) and the request goes to the checked address; a refused target is logged as a failed
attempt with no response. Requests time out after ``PT2REG_WEBHOOK_TIMEOUT`` seconds (default
10) per network operation and after twice that in all, never follow redirects, and keep at
most 256 characters of the response body.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import random
import socket
import threading
import time
import uuid
from typing import Any

from fastapi import APIRouter, Request

from ..access import server_key
from ..access.scopes import ADMIN
from ..access.webhook_targets import TargetPolicy, TargetRefused, check_new_target, pin
from ..errors import UsageError
from ..remote.wire import encode
from ..store import outbox
from ..store.engine import run_transaction
from . import fields
from .audit_head import ServerKey, sign_newest
from .auth import Call, on_scope

__all__ = ["Background", "signature_header", "router", "ENV_POLL", "ENV_RETRY_BASE",
           "ENV_RETRY_MAX", "ENV_TIMEOUT", "ENV_CONCURRENCY"]

log = logging.getLogger("registry.server.webhooks")
router = APIRouter()

ENV_POLL = "PT2REG_WEBHOOK_POLL"
ENV_RETRY_BASE = "PT2REG_WEBHOOK_RETRY_BASE"
ENV_RETRY_MAX = "PT2REG_WEBHOOK_RETRY_MAX"
ENV_TIMEOUT = "PT2REG_WEBHOOK_TIMEOUT"
ENV_CONCURRENCY = "PT2REG_WEBHOOK_CONCURRENCY"
ENV_SIGN_INTERVAL = "PT2REG_AUDIT_SIGN_INTERVAL"
_LEASE_SECONDS = 60.0
_LANE_IDLE_SECONDS = 300.0  # an endpoint's idle lane (and its connections) is closed after this


def _env_float(name: str, default: float) -> float:
    try:
        return max(0.01, float(os.environ.get(name, default)))
    except ValueError:
        return default


def signature_header(secret: bytes, message_id: str, timestamp: int, body: bytes) -> str:
    """The Standard Webhooks ``webhook-signature`` value for one message.

    >>> signature_header(b"k" * 24, "msg_1", 1700000000, b"{}")[:3]
    'v1,'
    """
    signed = f"{message_id}.{timestamp}.".encode() + body
    return "v1," + base64.b64encode(hmac.new(secret, signed, hashlib.sha256).digest()).decode("ascii")


class Background:
    """One per server process: signs audit heads and delivers webhooks, one lane per webhook,
    until stopped. ``targets``: the allowlist of internal targets (default: from the
    environment, ``PT2REG_WEBHOOK_ALLOW``)."""

    def __init__(self, engine: Any, key: ServerKey, targets: TargetPolicy | None = None) -> None:
        self.engine, self.key = engine, key
        self.targets = targets if targets is not None else TargetPolicy.from_env()
        self.replica = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.poll = _env_float(ENV_POLL, 1.0)
        self.sign_interval = _env_float(ENV_SIGN_INTERVAL, 1.0)
        self.retry_base = _env_float(ENV_RETRY_BASE, 10.0)
        self.retry_max = _env_float(ENV_RETRY_MAX, 3600.0)
        self.timeout = _env_float(ENV_TIMEOUT, 10.0)
        self.concurrency = max(1, int(_env_float(ENV_CONCURRENCY, 4)))
        self.deadline = 2 * self.timeout  # one whole delivery, whatever the receiver does
        # a claim (one row, sent at once) is held far longer than one delivery can take, so no
        # other replica ever re-sends a delivery this one is still sending
        self.lease = max(_LEASE_SECONDS, 8 * self.timeout + 10)
        self.stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._next_sign = 0.0
        self._lanes: dict[int, _Lane] = {}
        self._tls: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pt2reg-background", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout + 5)
        until = time.monotonic() + self.deadline + 1
        for lane in list(self._lanes.values()):
            lane.close(max(0.0, until - time.monotonic()))

    def tls(self) -> Any:
        """The TLS context every lane's client shares, made once (~20 ms each), with httpx's
        transport imported (~0.1 s) on the way: at start, not in the first delivery's way."""
        if self._tls is None:
            import httpx

            self._tls = httpx.create_ssl_context(trust_env=False)
            httpx.Client(verify=self._tls, trust_env=False).close()
        return self._tls

    def _run(self) -> None:
        self.tls()
        while not self.stopping.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - a database hiccup must not end the loop
                log.exception("background tick failed")
            self.stopping.wait(self.poll)

    def tick(self, wait: bool = False) -> None:
        """Sign the audit head when due, and start workers on every webhook with deliveries
        due (up to its concurrency). ``wait``: return once those workers are done."""
        now = time.monotonic()
        if now >= self._next_sign:
            self._next_sign = now + self.sign_interval
            sign_newest(self.engine, self.key)
        due = run_transaction(self.engine, outbox.due_webhooks, write=False)
        for webhook_id, count in due.items():
            lane = self._lanes.get(webhook_id)
            if lane is None:
                lane = self._lanes[webhook_id] = _Lane(self, webhook_id)
            lane.fill(count)
        for webhook_id, lane in list(self._lanes.items()):
            if webhook_id not in due and lane.idle_for() > _LANE_IDLE_SECONDS:
                del self._lanes[webhook_id]
                lane.close(0)
        if wait:
            for lane in list(self._lanes.values()):
                lane.join()

    def _backoff(self, attempts: int) -> float:
        delay = min(self.retry_max, self.retry_base * 2 ** attempts)
        return delay * (0.9 + 0.2 * random.random())

    def _exchange(self, client: Any, url: str, body: bytes, headers: dict[str, str],
                  started: float) -> tuple[int, str]:
        """POST and read at most an excerpt of the answer, all within 2 x the timeout: httpx's
        timeouts are per network operation, so a receiver trickling its headers a byte at a
        time would otherwise hold this worker (and its endpoint's queue) for as long as it
        likes. The request runs in a helper thread that is abandoned at the deadline (it ends
        at its own next timeout or when the receiver hangs up); the attempt counts as failed,
        so the message is sent again later (receivers deduplicate by ``webhook-id``)."""
        got: dict[str, Any] = {}

        def exchange() -> None:
            try:
                target = pin(url, self.targets)  # resolved and checked now, sent to that address
                with client.stream("POST", target.url, content=body, headers={**headers, **target.headers},
                                   extensions=target.extensions) as response:
                    chunk = b""
                    for part in response.iter_bytes():
                        chunk += part
                        if len(chunk) >= outbox.EXCERPT_CHARS or time.monotonic() - started > self.deadline:
                            break  # an excerpt only
                    got["answer"] = (response.status_code,
                                     chunk[:outbox.EXCERPT_CHARS].decode("utf-8", errors="replace"))
            except Exception as exc:  # noqa: BLE001 - reported by the caller
                got["error"] = exc

        worker = threading.Thread(target=exchange, name="pt2reg-webhook-post", daemon=True)
        worker.start()
        worker.join(self.deadline)
        if worker.is_alive():
            raise TimeoutError(f"no complete answer within {self.deadline:g} s (the receiver is too slow)")
        if "error" in got:
            raise got["error"]
        return got["answer"]

    def _deliver(self, client: Any, delivery_id: int, message_id: str, payload: str, url: str,
                 packed: str, attempts: int) -> None:
        key_id, enc = outbox.secret_of(packed)
        status_code = excerpt = error = None
        ok = False
        started = time.monotonic()
        try:
            if key_id != self.key.key_id:
                raise ValueError(f"the secret was encrypted under key {key_id[:19]}..., this "
                                 f"server's key is {self.key.key_id[:19]}...")
            secret = server_key.decrypt_secret(self.key.secrets_key, enc, url)
            body = payload.encode("utf-8")
            ts = int(time.time())
            headers = {"content-type": "application/json", "user-agent": "pt2-registry-webhooks",
                       "webhook-id": message_id, "webhook-timestamp": str(ts),
                       "webhook-signature": signature_header(secret, message_id, ts, body)}
            status_code, excerpt = self._exchange(client, url, body, headers, started)
            ok = 200 <= status_code < 300
            if not ok:
                error = f"HTTP {status_code}"
        except TargetRefused as exc:  # never called: no status, no excerpt
            error = exc.message[:500]  # "webhook target ... is refused: ..."
        except Exception as exc:  # noqa: BLE001 - every failure is logged as the attempt's result
            error = f"{type(exc).__name__}: {exc}"[:500]
        duration = int((time.monotonic() - started) * 1000)
        status = run_transaction(self.engine, lambda s: outbox.record_attempt(
            s, delivery_id, self.replica, ok=ok, status_code=status_code, error=error,
            excerpt=excerpt, duration_ms=duration, backoff_seconds=self._backoff(attempts)),
            write=True)
        log.info("webhook delivery %s (%s) attempt %d: %s", delivery_id, message_id, attempts + 1,
                 "delivered" if ok else f"{error} -> {status}")



class _Lane:
    """One webhook's deliveries in this process: at most ``owner.concurrency`` at once, each
    worker claiming the webhook's next due row itself until none is left, over a connection
    pool of the lane's own (a receiver that hangs holds only its own connections)."""

    def __init__(self, owner: Background, webhook_id: int) -> None:
        import httpx

        self.owner, self.webhook_id = owner, webhook_id
        limit = owner.concurrency
        self.client = httpx.Client(timeout=owner.timeout, follow_redirects=False, trust_env=False, verify=owner.tls(),
                                   limits=httpx.Limits(max_connections=2 * limit, max_keepalive_connections=limit))
        self._workers: set[threading.Thread] = set()
        self._lock = threading.Lock()
        self._idle_since = time.monotonic()

    def fill(self, due: int) -> None:
        """Start workers for ``due`` rows, up to the concurrency limit in all."""
        with self._lock:
            self._workers = {t for t in self._workers if t.is_alive()}
            if self.owner.stopping.is_set():
                return
            for _ in range(min(due, self.owner.concurrency - len(self._workers))):
                worker = threading.Thread(target=self._work, daemon=True,
                                          name=f"pt2reg-webhook-{self.webhook_id}")
                self._workers.add(worker)
                worker.start()

    def idle_for(self) -> float:
        with self._lock:
            busy = any(t.is_alive() for t in self._workers)
            return 0.0 if busy else time.monotonic() - self._idle_since

    def join(self, timeout: float | None = None) -> None:
        with self._lock:
            workers = list(self._workers)
        until = None if timeout is None else time.monotonic() + timeout
        for worker in workers:
            worker.join(None if until is None else max(0.0, until - time.monotonic()))

    def close(self, timeout: float) -> None:
        self.join(timeout)
        self.client.close()

    def _work(self) -> None:
        owner = self.owner
        try:
            while not owner.stopping.is_set():
                claimed = run_transaction(owner.engine, lambda s: outbox.claim(
                    s, owner.replica, lease_seconds=owner.lease, limit=1, webhook_id=self.webhook_id),
                    write=True)
                if not claimed:
                    return
                if owner.stopping.is_set():  # hand it back: another replica (or the next start) sends it
                    run_transaction(owner.engine, lambda s: outbox.release(s, [claimed[0][0]], owner.replica),  # noqa: B023
                                    write=True)
                    return
                owner._deliver(self.client, *claimed[0])
        except Exception:  # noqa: BLE001 - a database hiccup ends this worker; the next tick starts another
            log.exception("webhook %s: delivery worker failed", self.webhook_id)
        finally:
            with self._lock:
                self._idle_since = time.monotonic()


# -- routes (admin) -----------------------------------------------------------------------------

def _meta(request: Request) -> Any:
    return request.app.state.registry.meta


@router.post("/v1/webhooks", tags=["webhooks"])
def add_webhook(request: Request, call: Call = on_scope(ADMIN)) -> Any:
    """Subscribe a URL (body: url, events, model_glob, secret ``whsec_...``, host)."""
    body = call.body
    events = fields.items(body, "events", limit=50)
    if not all(isinstance(e, str) for e in events):
        raise UsageError("'events' must be a list of event names")
    url = outbox.validate_webhook_url(fields.text(body, "url", max_len=2048))
    check_new_target(url, request.app.state.webhook_targets)  # 422 for an internal address
    secret = fields.text(body, "secret", max_len=200)
    server_key.parse_webhook_secret(secret)   # a malformed secret is refused before anything else
    return encode(_meta(request).add_webhook(url, events, fields.opt_text(body, "model_glob", max_len=128),
                                             secret=secret, **call.writer()))


@router.get("/v1/webhooks", tags=["webhooks"])
def list_webhooks(request: Request, call: Call = on_scope(ADMIN)) -> Any:
    return {"webhooks": encode(_meta(request).list_webhooks())}


@router.delete("/v1/webhooks/{webhook_id}", tags=["webhooks"])
def remove_webhook(request: Request, webhook_id: int, host: str | None = None,
                   call: Call = on_scope(ADMIN)) -> Any:
    return encode(_meta(request).remove_webhook(webhook_id, **call.writer()))


@router.get("/v1/webhooks/deliveries", tags=["webhooks"])
def deliveries(request: Request, failed: bool = False, limit: int = 200,
               call: Call = on_scope(ADMIN)) -> Any:
    return {"deliveries": encode(_meta(request).webhook_deliveries(
        failed=failed, limit=max(1, min(limit, 1000))))}


@router.post("/v1/webhooks/deliveries/{delivery_id}/redeliver", tags=["webhooks"])
def redeliver(request: Request, delivery_id: int, call: Call = on_scope(ADMIN)) -> Any:
    return encode(_meta(request).redeliver_webhook(delivery_id))
