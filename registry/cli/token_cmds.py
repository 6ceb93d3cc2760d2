"""``pt2reg token``: create, list and revoke the API tokens a registry server accepts."""
from __future__ import annotations

from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import click

from ..access.scopes import ACTIONS
from ..format.times import iso_utc
from ._core import App, emit_json, pass_app, warn
from .render import console, esc

if TYPE_CHECKING:
    from ..store.records import TokenRecord

__all__ = ["token", "token_json"]


def _when(value: datetime | None) -> str | None:
    return iso_utc(value)


def token_json(t: TokenRecord, now: datetime) -> dict[str, Any]:
    """A token as ``--json`` prints it (never its secret); ``state`` as of ``now``."""
    return {"id": t.id, "owner": t.owner, "scopes": list(t.scopes), "state": t.state(now),
            "created_at": _when(t.created_at), "created_by": t.created_by,
            "expires_at": _when(t.expires_at), "revoked_at": _when(t.revoked_at),
            "last_used_at": _when(t.last_used_at)}


def _short(value: datetime | None, empty: str) -> str:
    return iso_utc(value, seconds=True) if value is not None else empty


#: written from ACTIONS, so the help lists every action a scope accepts (attest included)
_HELP = """API tokens for `pt2reg serve`: who may pull, push, move aliases, yank, delete, attest, read
    the audit log.

    \b
    Scopes (one per --scope):
      model:<glob>:<actions>   actions from {actions}, comma-separated;
                               '*' matches within one name segment, '**' across segments
                               (model:team/*:pull never matches team2/x or team/a/b)
      audit:read               read and verify the audit log
      admin                    everything, including tokens and gc
    Needs direct database access (--db) or an admin token. Only a hash of each secret is
    stored: a secret is printed once, when the token is created.
    Exit codes as for every command, plus 7: the token in use lacks a scope, or is missing,
    unknown, expired or revoked.
    """.format(actions=",".join(ACTIONS))


@click.group(help=_HELP)
def token() -> None:
    pass


@token.command("create")
@click.argument("owner", metavar="NAME")
@click.option("--scope", "scopes", multiple=True, required=True, metavar="SCOPE",
              help=f"model:<glob>:<actions> (actions: {','.join(ACTIONS)}), audit:read or admin (repeatable).")
@click.option("--expires", metavar="WHEN",
              help="Expire after a duration (30d, 12h, 90m, 2w) or at an ISO-8601 time "
                   "(default: never).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (with the secret).")
@pass_app
def token_create(app: App, owner: str, scopes: tuple[str, ...], expires: str | None,
                 as_json: bool) -> None:
    """Create a token for NAME (the owner the audit log records) and print its secret once.

    The secret alone goes to stdout, so `pt2reg token create ci --scope ... > ci.token`
    stores it; keep that file private (mode 0600) and pass it with --token-file.
    """
    record, secret = app.registry.create_token(owner, list(scopes), expires)
    warn(f"token {record.id} ({record.owner}) created; its secret is printed once and cannot be "
         f"shown again: store it now")
    if as_json:
        emit_json({"token": token_json(record, datetime.now(timezone.utc)), "secret": secret})
        return
    click.echo(secret)


@token.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def token_list(app: App, as_json: bool) -> None:
    """Every token: id, owner, scopes, state, expiry, last use (never a secret)."""
    tokens = app.registry.list_tokens()
    now = datetime.now(timezone.utc)
    if as_json:
        emit_json({"tokens": [token_json(t, now) for t in tokens]})
        return
    from rich.table import Column, Table

    table = Table("id", "owner", "scopes", "state", Column("expires", no_wrap=True),
                  Column("last used", no_wrap=True), "created by", box=None, header_style="bold")
    for t in tokens:
        table.add_row(str(t.id), esc(t.owner), esc(" ".join(t.scopes)), t.state(now),
                      _short(t.expires_at, "never"), _short(t.last_used_at, "-"),
                      esc(t.created_by))
    console().print(table)


@token.command("revoke")
@click.argument("token_id", metavar="ID", type=int)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def token_revoke(app: App, token_id: int, as_json: bool) -> None:
    """Revoke token ID now: every request with it is refused from then on (exit 7)."""
    record = app.registry.revoke_token(token_id)
    if as_json:
        emit_json({"token": token_json(record, datetime.now(timezone.utc))})
        return
    click.echo(f"revoked token {record.id} ({record.owner}) at {_short(record.revoked_at, '-')}")


COMMANDS = [token]
