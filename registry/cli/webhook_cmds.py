"""``pt2reg webhook``: subscribe URLs to registry events and inspect their deliveries."""
from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

import click

from ..format.times import iso_utc
from ._core import App, emit_json, pass_app
from .render import console, esc

if TYPE_CHECKING:
    from ..store.records import WebhookDelivery, WebhookRecord

__all__ = ["webhook", "COMMANDS"]


def _when(value: datetime | None) -> str | None:
    return iso_utc(value)


def webhook_json(w: WebhookRecord) -> dict[str, Any]:
    return {"id": w.id, "url": w.url, "events": list(w.events), "model_glob": w.model_glob,
            "created_at": _when(w.created_at), "created_by": w.created_by}


def delivery_json(d: WebhookDelivery) -> dict[str, Any]:
    return {"id": d.id, "webhook": d.webhook_id, "message_id": d.message_id, "event": d.event_type,
            "audit_seq": d.audit_seq, "status": d.status, "attempts": d.attempts,
            "created_at": _when(d.created_at), "next_attempt_at": _when(d.next_attempt_at),
            "delivered_at": _when(d.delivered_at),
            "history": [{"at": _when(a.at), "replica": a.replica, "ok": a.ok,
                         "status_code": a.status_code, "error": a.error,
                         "response_excerpt": a.response_excerpt, "duration_ms": a.duration_ms}
                        for a in d.history]}


@click.group()
def webhook() -> None:
    """Webhooks: the server POSTs signed JSON to a URL when something happens.

    \b
    Events: version.published, version.yanked, version.deprecated, version.restored,
    version.signed, alias.moved, alias.removed, attestation.recorded, policy.changed.
    Bodies carry the Standard Webhooks headers webhook-id, webhook-timestamp and
    webhook-signature (v1, HMAC-SHA256 with the secret). Every event is queued in the same
    transaction as the change; a running `pt2reg serve` (any replica) delivers it, retrying
    with backoff. Needs an admin token or direct database access.
    """


@webhook.command("add")
@click.argument("url")
@click.option("--events", "events", required=True, metavar="E,...",
              help="Comma-separated event types (see `pt2reg webhook --help`).")
@click.option("--model", "model_glob", metavar="GLOB", help="Only events about models matching GLOB (as in scopes: '*' within one segment, '**' across).")
@click.option("--secret-file", "secret_file", required=True, metavar="F",
              type=click.Path(dir_okay=False),
              help="File holding the signing secret, whsec_<base64 of 24-64 random bytes>.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def webhook_add(app: App, url: str, events: str, model_glob: str | None, secret_file: str,
                as_json: bool) -> None:
    """Subscribe URL (http:// or https://) to events."""
    names = [e.strip() for e in events.split(",") if e.strip()]
    record = app.registry.add_webhook(url, names, secret_file, model_glob=model_glob)
    if as_json:
        emit_json({"webhook": webhook_json(record)})
        return
    click.echo(f"webhook {record.id}: {record.url} <- {', '.join(record.events)}"
               + (f" (models {record.model_glob})" if record.model_glob else ""))


@webhook.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def webhook_list(app: App, as_json: bool) -> None:
    """Every webhook (never its secret)."""
    hooks = app.registry.list_webhooks()
    if as_json:
        emit_json({"webhooks": [webhook_json(w) for w in hooks]})
        return
    from rich.table import Table

    table = Table("id", "url", "events", "models", "created by", box=None, header_style="bold")
    for w in hooks:
        table.add_row(str(w.id), esc(w.url), esc(", ".join(w.events)), esc(w.model_glob or "*"),
                      esc(w.created_by))
    console().print(table)


@webhook.command("rm")
@click.argument("webhook_id", metavar="ID", type=int)
@pass_app
def webhook_rm(app: App, webhook_id: int) -> None:
    """Remove webhook ID (its undelivered events are dropped)."""
    record = app.registry.remove_webhook(webhook_id)
    click.echo(f"removed webhook {record.id} ({record.url})")


@webhook.command("deliveries")
@click.option("--failed", is_flag=True, help="Only deliveries whose last attempt failed.")
@click.option("--limit", default=200, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (every attempt).")
@pass_app
def webhook_deliveries(app: App, failed: bool, limit: int, as_json: bool) -> None:
    """Deliveries, newest first: status (pending, failing, delivered, dead) and attempts."""
    found = app.registry.webhook_deliveries(failed=failed, limit=limit)
    if as_json:
        emit_json({"deliveries": [delivery_json(d) for d in found]})
        return
    from rich.table import Table

    table = Table("id", "webhook", "event", "audit seq", "status", "attempts", "last result",
                  box=None, header_style="bold")
    for d in found:
        last = d.history[-1] if d.history else None
        result = ("-" if last is None else
                  (str(last.status_code) if last.status_code is not None else "") +
                  (f" {last.error}" if last.error and not last.ok else ""))
        table.add_row(str(d.id), str(d.webhook_id), esc(d.event_type), str(d.audit_seq), d.status,
                      str(d.attempts), esc(result.strip()))
    console().print(table)


@webhook.command("redeliver")
@click.argument("delivery_id", metavar="DELIVERY_ID", type=int)
@pass_app
def webhook_redeliver(app: App, delivery_id: int) -> None:
    """Queue delivery DELIVERY_ID again now (a running server sends it)."""
    d = app.registry.redeliver_webhook(delivery_id)
    click.echo(f"delivery {d.id} ({d.event_type} for webhook {d.webhook_id}) queued again")


COMMANDS = [webhook]
