"""``pt2reg login``, ``logout`` and ``whoami``: a client's token for a registry server.

``login URL --token-file F`` checks the token with the server first (``GET /v1/whoami``; exit
7 when it is refused) and keeps it for that URL in ``HOME/credentials.json`` (mode 0600), so
later commands with ``--registry URL`` / ``PT2REG_URL`` need no ``PT2REG_TOKEN``.
"""
from __future__ import annotations

import click

from ..format.times import iso_utc
from ._core import App, emit_json, info, pass_app

__all__ = ["login", "logout", "whoami"]


def _scopes_line(identity) -> str:
    return ", ".join(s.text for s in identity.scopes) or "(none)"


@click.command()
@click.argument("url", metavar="URL")
@click.option("--token-file", "token_file", metavar="FILE", required=True,
              help="File holding the token (as `pt2reg token create ... > FILE` wrote it).")
@pass_app
def login(app: App, url: str, token_file: str) -> None:
    """Check the token in FILE with the registry server at URL and keep it for URL.

    The token is kept in HOME/credentials.json (mode 0600); commands with --registry URL or
    PT2REG_URL use it when neither PT2REG_TOKEN nor --token-file is given.
    """
    from ..config import normalize_url
    from ..remote.credentials import read_token_file, save_login
    from ..remote.http import HttpClient
    from ..remote.meta import HttpMetadataStore

    url = normalize_url(url)
    token = read_token_file(token_file)
    meta = HttpMetadataStore(HttpClient(url, token))
    try:
        identity = meta.whoami()
    finally:
        meta.close()
    path = save_login(app.settings.home, url, token, owner=identity.owner, token_id=identity.token_id)
    click.echo(f"logged in to {url} as {identity.owner} (token {identity.token_id}; scopes: "
               f"{_scopes_line(identity)})")
    info(f"the token is kept in {path} (mode 0600); `pt2reg logout {url}` forgets it")


@click.command()
@click.argument("url", metavar="URL", required=False)
@click.option("--all", "everything", is_flag=True, help="Forget the tokens of every server.")
@pass_app
def logout(app: App, url: str | None, everything: bool) -> None:
    """Forget the token kept for URL (default: --registry / PT2REG_URL). The token itself
    stays valid until it expires or an admin revokes it (`pt2reg token revoke ID`)."""
    from ..errors import UsageError
    from ..remote.credentials import remove_login

    if everything and url:
        raise UsageError("give a URL or --all, not both")
    if not everything:
        url = url or app.settings.url
        if url is None:
            raise UsageError("which registry? give its URL", hint="pt2reg logout URL, or --all")
    gone = remove_login(app.settings.home, None if everything else url)
    if not gone:
        click.echo(f"no token was kept for {url}" if url else "no token was kept")
        return
    for u in gone:
        click.echo(f"logged out of {u}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def whoami(app: App, as_json: bool) -> None:
    """Who the registry server takes this client's token for: owner, token id, scopes, expiry."""
    from ..errors import UsageError

    no_server = UsageError("whoami asks a registry server, and none is selected",
                           hint="pass --registry URL or set PT2REG_URL")
    if not app.settings.remote:
        raise no_server
    identity = app.registry.meta.whoami()
    if identity is None:  # a store reached directly declares no token identity
        raise no_server
    expires = iso_utc(identity.expires_at)
    if as_json:
        emit_json({"registry": app.settings.url, "owner": identity.owner, "token_id": identity.token_id,
                   "scopes": [s.text for s in identity.scopes], "expires_at": expires})
        return
    click.echo(f"{identity.owner} (token {identity.token_id}) at {app.settings.url}")
    click.echo(f"scopes: {_scopes_line(identity)}")
    click.echo(f"expires: {expires or 'never'}")


COMMANDS = [login, logout, whoami]
