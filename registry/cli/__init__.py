"""``pt2reg``: a thin click layer over the Python API.

Commands parse arguments, call one API function and render the result. They never import torch,
sqlalchemy or boto3 themselves; heavy modules load only inside the commands that need them, so
``pt2reg --help`` stays fast. Every ``RegistryError`` becomes one line on stderr and its exit
code (2 usage, 3 not found, 4 incompatible, 5 integrity, 6 conflict, 1 otherwise).
Commands are plain click commands in ``*_cmds`` modules, each listing its ``COMMANDS``; this
module adds them to the group (the command modules never import it).
"""
from __future__ import annotations

import click

from . import (
    audit_cmds,
    bundle_cmds,
    governance_cmds,
    key_cmds,
    oci_cmds,
    remote_cmds,
    runtime_cmds,
    server_cmds,
    serving_cmds,
    store_cmds,
    token_cmds,
    webhook_cmds,
)
from ._core import RegistryGroup

__all__ = ["main", "cli"]


@click.group(cls=RegistryGroup, context_settings={"help_option_names": ["-h", "--help"],
                                                  "max_content_width": 100})
@click.option("--home", metavar="DIR", help="Registry home (default $PT2REG_HOME or ~/.pt2reg).")
@click.option("--db", metavar="URL", help="Metadata database URL (default $PT2REG_DB or SQLite under home).")
@click.option("--store", metavar="URL", help="Blob store URL: file:///dir or s3://bucket/prefix "
              "(default $PT2REG_STORE or HOME/store).")
@click.option("--registry", "registry_url", metavar="URL",
              help="A registry server (pt2reg serve) instead of --db/--store (default $PT2REG_URL).")
@click.option("--token-file", metavar="FILE",
              help="File holding the server's token (default $PT2REG_TOKEN, else what `pt2reg login` saved).")
@click.version_option(package_name="pt2-registry", prog_name="pt2reg")
@click.pass_context
def cli(ctx: click.Context, home: str | None, db: str | None, store: str | None, registry_url: str | None,
        token_file: str | None) -> None:
    """pt2reg: package, publish, pull, verify and run torch.export programs.

    \b
    Typical flow:
      pt2reg bundle encoder=enc.pt2 decoder=dec.pt2 --sample encoder=x.pt -o model.pt2b
      pt2reg push model.pt2b --name team/translator --alias staging
      pt2reg verify team/translator@staging --device cuda:0
      pt2reg run team/translator@3 --program decoder --inputs in.pt --output out.pt

    Refs: NAME (latest), NAME@7, NAME@prod, NAME@sha256:<hex>.
    Remote: --registry URL (or PT2REG_URL) and a token (PT2REG_TOKEN, --token-file, or
    `pt2reg login URL --token-file F`) replace --db/--store.

    Exit codes: 0 ok, 2 usage, 3 not found, 4 incompatible, 5 integrity/safety, 6 conflict,
    7 access denied (token missing, refused or lacking a scope), 1 other.
    """
    from ._core import App

    ctx.obj = App(home=home, db=db, store=store, registry=registry_url, token_file=token_file)
    ctx.call_on_close(ctx.obj.close)  # the registry's database connections end with the command


for _module in (bundle_cmds, store_cmds, runtime_cmds, audit_cmds, key_cmds, token_cmds, remote_cmds, server_cmds,
                governance_cmds, serving_cmds, webhook_cmds, oci_cmds):
    for _command in _module.COMMANDS:
        cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="pt2reg")
    except SystemExit:
        # The command is done (its registry closed, its output written) and the process ends:
        # what is left is the interpreter's shutdown, whose last garbage collection walks every
        # object the imports made (SQLAlchemy's ORM alone: ~50 ms of CPU, a quarter of `pt2reg
        # list`). Frozen objects are skipped by it; atexit handlers, weakref finalizers and
        # file flushes still run.
        import gc

        gc.freeze()
        raise
