"""The registry's web pages, served by ``pt2reg serve`` at ``/``: read-only, server-rendered
(Jinja2), behind the same tokens and scopes as the API (``pages``)."""
from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from ...errors import RegistryError
from ..errors import status_of
from .pages import PAGE_PATHS, error_page, router

__all__ = ["install", "router", "PAGE_PATHS"]


def install(app: FastAPI) -> None:
    """Mount the pages on ``app`` (after ``install_error_handlers``): a registry error raised
    by a page (its permission check included) answers as a page, the API's stay JSON."""
    app.include_router(router)
    api_handler = app.exception_handlers[RegistryError]

    async def registry_error(request: Request, exc: Exception) -> Any:
        if request.url.path in PAGE_PATHS and isinstance(exc, RegistryError):
            return error_page(request, exc, status_of(exc))
        return await api_handler(request, exc)

    app.add_exception_handler(RegistryError, registry_error)
