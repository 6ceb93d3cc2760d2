"""The client: publish, resolve, pull, lifecycle and gc over a metadata store and a blob store.

    >>> from registry.client import Registry
    >>> with Registry() as reg:
    ...     reg.push("model.pt2b", "team/encoder", aliases=["staging"])
"""
from __future__ import annotations

from .api import GcResult, PullResult, PushResult, Registry

__all__ = ["Registry", "PushResult", "PullResult", "GcResult"]
