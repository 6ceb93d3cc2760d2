"""``WebhookStore`` over ``/v1/webhooks`` (the server seals the secret under its key)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import (
    TYPE_CHECKING,
    Any,
)

from ...store.records import (
    WebhookDelivery,
    WebhookRecord,
)
from ..wire import decode, decode_list

if TYPE_CHECKING:
    pass

from ._base import HttpStoreBase, _field

__all__ = ["HttpWebhookStore"]


class HttpWebhookStore(HttpStoreBase):
    """``WebhookStore`` over ``/v1/webhooks`` (the server seals the secret under its key)."""

    def add_webhook(self, url: str, events: Sequence[str], model_glob: str | None, *, secret: str,
                    actor: str, host: str, audit_details: Mapping[str, Any] | None = None) -> WebhookRecord:
        """Subscribe ``url``; the server encrypts the secret (``whsec_...``) under its own key."""
        return decode(WebhookRecord, self.client.post_json("/v1/webhooks", {
            "url": url, "events": list(events), "model_glob": model_glob, "secret": secret,
            "host": host}))

    def list_webhooks(self) -> list[WebhookRecord]:
        return decode_list(WebhookRecord, _field(self.client.get_json("/v1/webhooks"), "webhooks"))

    def remove_webhook(self, webhook_id: int, *, actor: str, host: str,
                       audit_details: Mapping[str, Any] | None = None) -> WebhookRecord:
        return decode(WebhookRecord, self.client.delete_json(f"/v1/webhooks/{int(webhook_id)}",
                                                             {"host": host}))

    def webhook_deliveries(self, *, failed: bool = False, limit: int = 200) -> list[WebhookDelivery]:
        answer = self.client.get_json("/v1/webhooks/deliveries",
                                      {"failed": "true" if failed else None, "limit": limit})
        return decode_list(WebhookDelivery, _field(answer, "deliveries"))

    def redeliver_webhook(self, delivery_id: int) -> WebhookDelivery:
        return decode(WebhookDelivery, self.client.post_json(
            f"/v1/webhooks/deliveries/{int(delivery_id)}/redeliver", {}))
