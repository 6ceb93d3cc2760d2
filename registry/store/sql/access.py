"""``AccessStore`` over SQL: API tokens (``registry.store.tokens``)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import select

from ...access.scopes import Identity, parse_scope
from ...access.tokens import hash_secret, new_secret, validate_owner
from ...errors import NotAuthenticatedError, UsageError
from .. import tokens as token_rows
from ..orm import (
    TokenRow,
)
from ..records import (
    TokenRecord,
)
from ._base import SqlStoreBase, _audit_details

__all__ = ["SqlAccessStore"]


class SqlAccessStore(SqlStoreBase):
    """API tokens: only their SHA-256 is kept."""

    def whoami(self) -> Identity | None:
        """None: direct database access involves no token (a server client answers its token's
        identity)."""
        return None

    def create_token(self, owner: str, scopes: Sequence[str], *, expires_at: datetime | None,
                     actor: str, host: str, audit_details: Mapping[str, Any] | None = None,
                     ) -> tuple[TokenRecord, str]:
        """Create an API token; returns ``(record, secret)``. The secret is returned this once:
        only its SHA-256 is stored. Scopes are parsed and stored canonically (UsageError for a
        bad one); audited as ``token.create`` (owner, scopes, expiry; never the secret).

        For example (``store`` an open ``SqlMetadataStore``)::

            record, secret = store.create_token("ci", ["model:team/*:push,pull"],
                                                expires_at=None, actor="ana", host="laptop")
            record.scopes, secret[:5]   # -> (['model:team/*:pull,push'], 'pt2r_')
        """
        validate_owner(owner)
        if isinstance(scopes, str):
            raise UsageError("token scopes must be a list of scopes, not one string")
        canonical = list(dict.fromkeys(parse_scope(text).text for text in scopes))
        if not canonical:
            raise UsageError("a token needs at least one scope",
                             hint="pass --scope, e.g. --scope model:team/*:pull")
        if expires_at is not None and expires_at.tzinfo is None:
            raise UsageError("a token's expiry must be a timezone-aware datetime")
        extra = _audit_details(audit_details)
        secret = new_secret()
        digest = hash_secret(secret)
        record = self._write(lambda s: token_rows.create(
            s, owner=owner, scopes=canonical, secret_hash=digest, expires_at=expires_at,
            actor=actor, host=host, extra=extra).to_record())
        return record, secret

    def list_tokens(self) -> list[TokenRecord]:
        """Every token (revoked and expired ones too), by id; never a secret.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(t.id, t.owner) for t in store.list_tokens()]   # -> [(1, 'ci')]
        """
        return self._read(lambda s: [row.to_record() for row in s.scalars(
            select(TokenRow).order_by(TokenRow.id))])

    def revoke_token(self, token_id: int, *, actor: str, host: str,
                     audit_details: Mapping[str, Any] | None = None) -> TokenRecord:
        """Revoke a token now (NotFoundError for an unknown id); audited as ``token.revoke``.
        Revoking a revoked token returns it unchanged.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.revoke_token(1, actor="ana", host="laptop").revoked_at is not None   # -> True
        """
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise UsageError(f"invalid token id {token_id!r}", hint="`pt2reg token list` shows them")
        extra = _audit_details(audit_details)
        return self._write(lambda s: token_rows.revoke(
            s, token_id, actor=actor, host=host, extra=extra).to_record())

    def authenticate(self, secret: str) -> Identity:
        """The identity of the token with ``secret``: NotAuthenticatedError (exit 7) when no
        token has it, or it was revoked or has expired (saying when, by the database's clock).
        A read; ``last_used_at`` is written at most once a minute per token.

        For example (``store`` an open ``SqlMetadataStore``)::

            store.authenticate(secret).owner   # -> 'ci'
        """
        if not isinstance(secret, str) or not secret.strip():
            raise NotAuthenticatedError("no token given",
                                        hint="set PT2REG_TOKEN or pass --token-file")
        digest = hash_secret(secret.strip())
        identity, due = self._read(lambda s: token_rows.check(s, digest))
        if due:
            self._write(lambda s: token_rows.touch(s, identity.token_id))
        return identity
