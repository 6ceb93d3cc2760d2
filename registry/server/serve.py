"""``pt2reg serve``: check the database, then run the app on uvicorn.

The schema check runs before uvicorn starts, so a database behind head stops the command with
the same one-line ``DatabaseOutdatedError`` the CLI prints (exit 1), not a server that answers
503 forever. With ``workers > 1`` uvicorn starts that many processes, each building its app
from the environment (``create_app_from_env``).
"""
from __future__ import annotations

import logging
import os

from ..config import Settings
from ..constants import ENV_DB, ENV_HOME, ENV_STORE
from ..store.engine import redacted_url
from .app import ENV_PUBLIC_URL, create_app

__all__ = ["serve"]


def serve(settings: Settings, *, host: str = "127.0.0.1", port: int = 8710,
          public_url: str | None = None, workers: int = 1, log_level: str = "info") -> None:
    """Serve the registry ``settings`` names until interrupted."""
    import uvicorn

    logging.basicConfig(level=getattr(logging, log_level.upper(), logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("alembic").setLevel(logging.WARNING)  # not a line per migration step
    app = create_app(settings, public_url=public_url)  # raises before listening when not ready
    state = app.state.registry
    logging.getLogger("registry.server").info(
        "serving %s and %s (%s)", redacted_url(state.meta.engine), state.blobs.url,
        "presigned S3 URLs: blob bytes bypass this server" if state.presigns
        else "local store: this server streams blob bytes")
    options = dict(host=host, port=port, log_level=log_level, server_header=False,
                   timeout_keep_alive=5, timeout_graceful_shutdown=10)
    if workers <= 1:
        uvicorn.run(app, **options)
        return
    app.state.registry.close()  # each worker opens its own connections
    os.environ.update({ENV_DB: settings.db_url, ENV_STORE: settings.store_url,
                       ENV_HOME: str(settings.home)})
    if public_url:
        os.environ[ENV_PUBLIC_URL] = public_url
    uvicorn.run("registry.server.app:create_app_from_env", factory=True, workers=workers, **options)
