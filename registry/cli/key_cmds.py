"""``pt2reg key generate``."""
from __future__ import annotations

import click

__all__ = ["key"]


@click.group()
def key() -> None:
    """Signing keys: ECDSA (P-256 by default, what OpenSSF Model Signing verifies) or Ed25519."""


@key.command("generate")
@click.argument("path", type=click.Path(dir_okay=False))
@click.option("--type", "key_type", type=click.Choice(["ecdsa-p256", "ecdsa-p384", "ed25519"]), default="ecdsa-p256",
              show_default=True, help="Key type. ECDSA keys' signatures also verify with `model_signing verify key`.")
def key_generate(path: str, key_type: str) -> None:
    """Write PATH.key (private, mode 0600) and PATH.pub (share this one)."""
    from ..format.signing import generate_keypair

    key_path, pub_path = generate_keypair(path, key_type)
    click.echo(f"{key_path}\n{pub_path}")


COMMANDS = [key]
