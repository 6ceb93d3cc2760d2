"""The routes of the wire protocol (``/v1/...``), each declaring its permission (``auth``).

Routes are plain ``def`` functions: FastAPI runs them in its thread pool, where the
synchronous SQL store belongs. Every write passes ``actor`` = the token's owner,
``host`` = what the client says, and ``audit_details`` = the token id (``Call.writer``).
Model names contain '/', so they travel as query parameters.

One module per concern: ``health``, ``versions`` (models, versions, aliases, status, publish),
``lineage``, ``audit``, ``pushes`` (claims and gc), ``access`` (tokens), ``blobs``; ``router``
holds every route of them (the OCI, governance, webhook and audit-head routes are their own
modules beside this package).
"""
from __future__ import annotations

from fastapi import APIRouter

from . import access, audit, blobs, health, lineage, pushes, versions
from ._common import json_body_doc, server_state
from .lineage import redacted_node

__all__ = ["router", "server_state", "json_body_doc", "redacted_node"]

router = APIRouter()
for _module in (health, versions, lineage, audit, pushes, access, blobs):
    router.routes.extend(_module.router.routes)
