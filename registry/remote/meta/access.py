"""``AccessStore`` over ``/v1/tokens`` and ``/v1/whoami``."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...access.scopes import Identity, parse_scope
from ...store.records import (
    TokenRecord,
)
from ..wire import decode, decode_list, format_datetime, parse_datetime

if TYPE_CHECKING:
    pass

from ._base import HttpStoreBase, _field, _malformed

__all__ = ["HttpAccessStore"]


class HttpAccessStore(HttpStoreBase):
    """``AccessStore`` over ``/v1/tokens`` and ``/v1/whoami``."""

    def whoami(self) -> Identity:
        """Who the server takes this client's token for (``NotAuthenticatedError`` if nobody)."""
        answer = self.client.get_json("/v1/whoami")
        try:
            expires = answer.get("expires_at")
            return Identity(token_id=int(answer["token_id"]), owner=str(answer["owner"]),
                            scopes=tuple(parse_scope(str(s)) for s in answer["scopes"]),
                            expires_at=parse_datetime(expires) if expires else None)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise _malformed("/v1/whoami") from exc

    def create_token(self, owner: str, scopes: Sequence[str], *, expires_at: datetime | None, actor: str,
                     host: str, audit_details: Mapping[str, Any] | None = None) -> tuple[TokenRecord, str]:
        answer = self.client.post_json("/v1/tokens", {
            "owner": owner, "scopes": list(scopes), "host": host,
            "expires_at": format_datetime(expires_at) if expires_at is not None else None})
        secret = _field(answer, "secret")
        if not isinstance(secret, str):
            raise _malformed("/v1/tokens")
        return decode(TokenRecord, _field(answer, "token")), secret

    def list_tokens(self) -> list[TokenRecord]:
        return decode_list(TokenRecord, _field(self.client.get_json("/v1/tokens"), "tokens"))

    def revoke_token(self, token_id: int, *, actor: str, host: str,
                     audit_details: Mapping[str, Any] | None = None) -> TokenRecord:
        return decode(TokenRecord, self.client.delete_json(f"/v1/tokens/{int(token_id)}"))
