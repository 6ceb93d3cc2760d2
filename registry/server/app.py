"""The registry server's ASGI app: the wire protocol over the SQL store and the blob store::

    app = create_app(Settings.resolve(db="postgresql://reg@db/registry", store="s3://models"))
    # uvicorn registry.server.app:create_app_from_env --factory   (PT2REG_DB, PT2REG_STORE)

The app is stateless beyond its connections: every replica over one database and one store
serves the same registry. Startup checks the schema is at head (``DatabaseOutdatedError``
otherwise, the same line the CLI prints).
"""
from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from ..access.server_key import secret_sealer
from ..access.webhook_targets import TargetPolicy
from ..blobs import open_blob_store
from ..config import Settings
from ..constants import VERSION
from ..store import open_metadata_store
from .audit_head import load_key as load_server_key
from .audit_head import router as audit_head_router
from .client_events import EventGuard
from .errors import install_error_handlers
from .governance import router as governance_router
from .limits import LimitsMiddleware, ServerLimits
from .oci import router as oci_router
from .routes import router
from .state import ServerState
from .web import install as install_web
from .webhooks import Background
from .webhooks import router as webhooks_router

__all__ = ["create_app", "create_app_from_env", "ENV_PUBLIC_URL"]

ENV_PUBLIC_URL = "PT2REG_PUBLIC_URL"


def create_app(settings: Settings, *, public_url: str | None = None,
               limits: ServerLimits | None = None) -> FastAPI:
    """The app over the stores ``settings`` name. The database must be at head (a fresh
    SQLite file is created at head; PostgreSQL never is: ``pt2reg db upgrade``).
    ``public_url``: the base URL clients reach this server at (for the blob URLs it hands out
    with a local store); default, each request's own base URL."""
    targets = TargetPolicy.from_env()  # PT2REG_WEBHOOK_ALLOW: the internal webhook targets allowed
    event_guard = EventGuard.from_env()  # PT2REG_EVENT_RATE / _BURST: client events per token
    meta = open_metadata_store(settings.db_url, auto_create=settings.embedded_db)
    try:
        blobs = open_blob_store(settings.store_url)
    except BaseException:
        meta.close()
        raise
    state = ServerState(meta=meta, blobs=blobs, limits=limits or ServerLimits(),
                        public_url=public_url.rstrip("/") if public_url else None)

    server_key = load_server_key(settings.home)  # signs audit heads, seals webhook secrets
    meta.secret_sealer = secret_sealer(server_key.secrets_key, server_key.key_id)
    background = Background(meta.engine, server_key, targets)  # webhook delivery + audit head signing

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        background.start()
        try:
            yield
        finally:
            background.stop()
            state.close()

    app = FastAPI(title="pt2-registry", version=VERSION, lifespan=lifespan, routes=list(router.routes) + list(governance_router.routes) + list(oci_router.routes)
                  + list(webhooks_router.routes) + list(audit_head_router.routes),
                  openapi_url=None, docs_url=None, redoc_url=None,
                  description="The pt2-registry wire protocol: `Authorization: Bearer <token>`; "
                              "errors are `{\"error\": {type, exit_code, message, hint, scope}}`.")
    app.state.registry = state
    app.state.server_key = server_key
    app.state.webhook_targets = targets
    app.state.event_guard = event_guard
    hide = tuple(t for t in (blobs.url, _local_path(blobs.url)) if t)
    install_error_handlers(app, hide=hide)
    install_web(app)  # the web pages at / (after the API's error handlers: it wraps them)
    app.add_middleware(LimitsMiddleware, limits=state.limits)
    return app


def create_app_from_env() -> Any:
    """``uvicorn --factory`` entry point: PT2REG_DB / PT2REG_STORE / PT2REG_HOME and
    PT2REG_PUBLIC_URL from the environment (what ``pt2reg serve --workers N`` sets)."""
    return create_app(Settings.resolve(), public_url=os.environ.get(ENV_PUBLIC_URL) or None)


def _local_path(url: str) -> str:
    """The directory of a ``file://`` store URL (kept out of error messages too), else ''."""
    import urllib.parse

    parsed = urllib.parse.urlparse(url)
    return urllib.parse.unquote(parsed.path) if parsed.scheme == "file" else ""
