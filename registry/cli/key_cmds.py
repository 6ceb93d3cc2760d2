"""``pt2reg key generate``."""
from __future__ import annotations

import click

__all__ = ["key"]


@click.group()
def key() -> None:
    """Ed25519 signing keys."""


@key.command("generate")
@click.argument("path", type=click.Path(dir_okay=False))
def key_generate(path: str) -> None:
    """Write PATH.key (private, mode 0600) and PATH.pub (share this one)."""
    from ..format.signing import generate_keypair

    key_path, pub_path = generate_keypair(path)
    click.echo(f"{key_path}\n{pub_path}")


COMMANDS = [key]
