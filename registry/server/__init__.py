"""The registry server: the wire protocol over HTTP (FastAPI on uvicorn), scoped tokens,
presigned S3 URLs. ``create_app`` builds the ASGI app, ``serve`` runs it (``pt2reg serve``).

Modules: ``app`` (the factory), ``routes`` (every route, each declaring its permission),
``auth`` (the one authorization choke point), ``blobio`` (presigned URLs, local streaming with
Range), ``limits`` (body caps, JSON depth, slow clients), ``errors`` (the JSON error body),
``state`` (stores and counters of one process), ``fields`` (typed body fields), ``serve``.
"""
from __future__ import annotations

from .app import create_app, create_app_from_env
from .limits import ServerLimits

__all__ = ["create_app", "create_app_from_env", "ServerLimits"]
