"""What every HTTP store class shares: the client (``registry.remote.http``) and answer checks."""
from __future__ import annotations

from typing import Any

from ..http import HttpClient

__all__ = ["HttpStoreBase"]


class HttpStoreBase:
    """A registry server's metadata, through ``client`` (shared with ``HttpBlobStore``)."""

    def __init__(self, client: HttpClient) -> None:
        self.client = client

    def __repr__(self) -> str:
        return f"HttpMetadataStore({self.client.base_url!r})"

    @property
    def url(self) -> str:
        return self.client.base_url

    def close(self) -> None:
        self.client.close()


def _field(answer: Any, key: str) -> Any:
    """``answer[key]``, or ``StoreError`` when the server sent something else."""
    if not isinstance(answer, dict) or key not in answer:
        raise _malformed(f"a request (no {key!r} in the answer)")
    return answer[key]


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _malformed(where)
    return value


def _malformed(where: str) -> Exception:
    from ...errors import StoreError

    return StoreError(f"the registry server sent a malformed answer to {where}",
                      hint="the client and the server may be different versions of pt2reg")
