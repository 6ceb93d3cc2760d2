"""``WebhookStore`` over SQL: subscriptions, deliveries and redelivery (``registry.store.outbox``)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from sqlalchemy.orm import Session

from ...errors import UsageError
from .. import audit_log
from ..records import (
    WebhookDelivery,
    WebhookRecord,
)
from ._base import SqlStoreBase


class SecretSealer(Protocol):
    """``(url, secret text) -> (sealed secret, key id)``: a webhook secret (``whsec_...``,
    checked here) encrypted for ``url`` under a server key (``registry.access.server_key``)."""

    def __call__(self, url: str, secret: str, /) -> tuple[str, str]: ...


__all__ = ["SqlWebhookStore", "SecretSealer"]


class SqlWebhookStore(SqlStoreBase):
    """Webhook subscriptions and deliveries (``registry.store.outbox``)."""

    #: seals a webhook's secret under the server's key: set by whoever holds the key (the
    #: server at start-up; ``Registry`` over the key file in its home); None: no key here
    secret_sealer: SecretSealer | None = None

    def add_webhook(self, url: str, events: Sequence[str], model_glob: str | None, *, secret: str,
                    actor: str, host: str, audit_details: Mapping[str, Any] | None = None) -> WebhookRecord:
        """Subscribe ``url`` to ``events`` (audited ``webhook.add``): ``secret`` (``whsec_...``)
        is sealed by ``secret_sealer`` and stored sealed, never in the log. UsageError when this
        store has no sealer."""
        from .. import outbox

        if self.secret_sealer is None:
            raise UsageError("this store has no server key to seal webhook secrets with",
                             hint="add webhooks through the registry server, or open the store with its key")
        secret_enc, key_id = self.secret_sealer(url, secret)

        def work(s: Session) -> WebhookRecord:
            record = outbox.add_webhook(s, url, events, model_glob, secret_enc, key_id, actor=actor)
            audit_log.append_event(s, "webhook.add", actor=actor, host=host, details={
                "webhook": record.id, "url": url, "events": record.events, "model_glob": model_glob},
                extra=audit_details)
            return record
        return self._write(work)

    def list_webhooks(self) -> list[WebhookRecord]:
        from .. import outbox

        return self._read(outbox.list_webhooks)

    def remove_webhook(self, webhook_id: int, *, actor: str, host: str,
                       audit_details: Mapping[str, Any] | None = None) -> WebhookRecord:
        from .. import outbox

        def work(s: Session) -> WebhookRecord:
            record = outbox.remove_webhook(s, webhook_id)
            audit_log.append_event(s, "webhook.remove", actor=actor, host=host,
                                   details={"webhook": webhook_id, "url": record.url}, extra=audit_details)
            return record
        return self._write(work)

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[WebhookDelivery]:
        from .. import outbox

        return self._read(lambda s: outbox.deliveries(s, failed=failed, limit=limit))

    def redeliver_webhook(self, delivery_id: int) -> WebhookDelivery:
        from .. import outbox

        return self._write(lambda s: outbox.redeliver(s, delivery_id))
