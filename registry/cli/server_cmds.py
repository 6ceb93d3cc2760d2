"""``pt2reg serve``: run the registry server over this machine's database and blob store."""
from __future__ import annotations

import dataclasses
import importlib.util

import click

from ..errors import RegistryError, UsageError
from ._core import App, pass_app

__all__ = ["serve", "COMMANDS"]


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", default=8710, show_default=True, type=click.IntRange(1, 65535),
              help="Port to listen on.")
@click.option("--db", metavar="URL", help="Metadata database URL (default: the global --db, "
              "$PT2REG_DB or SQLite under home).")
@click.option("--store", metavar="URL", help="Blob store URL: file:///dir or s3://bucket/prefix "
              "(default: the global --store, $PT2REG_STORE or HOME/store).")
@click.option("--public-url", metavar="URL",
              help="The URL clients reach this server at (behind a load balancer); blob URLs "
                   "it hands out for a local store start with it, and the web login accepts "
                   "forms only from its origin. Default: each request's own.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Worker processes (or run several replicas: they share nothing but the "
                   "database and the store).")
@click.option("--signing-key", "signing_key", metavar="FILE", type=click.Path(dir_okay=False),
              help="Ed25519 private key (PEM) that signs the audit head and seals webhook "
                   "secrets; every replica needs the same one. Default: $PT2REG_SIGNING_KEY, "
                   "else HOME/server-signing.key, generated (0600) on first start.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@pass_app
def serve(app: App, host: str, port: int, db: str | None, store: str | None,
          public_url: str | None, workers: int, signing_key: str | None, log_level: str) -> None:
    """Serve the registry over HTTP (--db and --store name what it serves).

    Clients then need only the URL and a token (`pt2reg token create`): PT2REG_URL and
    PT2REG_TOKEN. With an S3 store, blob bytes go between clients and S3 through presigned
    URLs, never through the server. The database must be at the current schema
    (`pt2reg db upgrade`); the server refuses to start otherwise.

    \b
    Environment read at start:
      PT2REG_WEBHOOK_ALLOW  internal webhook targets to allow, comma-separated host
                            names (*.corp.example for subdomains), addresses and CIDRs,
                            e.g. 'hooks.internal, 10.20.0.0/16, ::1'. Without it, a target
                            on a loopback, private, link-local (cloud metadata), multicast
                            or other non-global address is refused when added and before
                            every delivery (checked on what the name resolves to then).
      PT2REG_WEBHOOK_CONCURRENCY  deliveries at once per webhook endpoint (default 4)
      PT2REG_EVENT_RATE, PT2REG_EVENT_BURST  pull/load events a token may record, per
                            second and at once (default 5 and 600; per server process)

    The web login and logout accept a POST only when its Origin (else its Referer) is
    this server's origin: --public-url's when given, else the request's own (its Host
    header, and X-Forwarded-Proto's scheme when present). Behind a proxy that rewrites
    Host or terminates TLS without X-Forwarded-Proto, set --public-url.
    """
    missing = [m for m in ("fastapi", "uvicorn") if importlib.util.find_spec(m) is None]
    if missing:
        raise RegistryError(f"pt2reg serve needs {' and '.join(missing)}",
                            hint="install 'pt2-registry[server]'")
    settings = app.settings
    if db or store:  # they name what is served; a PT2REG_URL in the environment does not apply
        settings = dataclasses.replace(settings, db_url=db or settings.db_url,
                                       store_url=store or settings.store_url, url=None)
    if settings.remote:
        raise UsageError("pt2reg serve serves a database and a blob store (--db, --store), "
                         "not another registry server", hint="unset PT2REG_URL or drop --registry")
    if public_url:
        from ..config import normalize_url

        public_url = normalize_url(public_url)
    if signing_key:  # read by create_app in this process and in every worker
        import os

        from ..access.server_key import ENV_SIGNING_KEY

        os.environ[ENV_SIGNING_KEY] = os.path.abspath(signing_key)
    from ..server.serve import serve as run_server

    run_server(settings, host=host, port=port, public_url=public_url, workers=workers,
               log_level=log_level)


COMMANDS = [serve]
