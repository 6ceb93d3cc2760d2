"""Registry commands: push, pull, list, show, alias, deprecate, yank, gc, db."""
from __future__ import annotations

from typing import Any

import click

from ..format.times import iso_utc
from ._core import App, emit_json, info, pass_app, transfer_progress, warn
from .render import console, esc, format_size, print_attestations
from .views import attestation_json, version_json, version_signatures_json

__all__ = ["push", "pull", "list_cmd", "show", "alias", "deprecate", "yank", "gc", "db", "sign"]


@click.command()
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--name", required=True, help="Model name (lowercase; team/model allowed).")
@click.option("--alias", "aliases", multiple=True, metavar="A", help="Point alias A at the new version (repeatable).")
@click.option("--parent", "parents", multiple=True, metavar="REF", help="A model version this one derives from (repeatable).")
@click.option("--dataset", "datasets", multiple=True, metavar="URI[@sha256:HEX]", help="A dataset it was trained on (repeatable).")
@click.option("--run-id", metavar="ID", help="Training run id.")
@click.option("--git-commit", metavar="SHA", help="Code commit (default: HEAD of the current git repo, if any).")
@click.option("--code-uri", metavar="URI", help="Where the training code lives.")
@click.option("--sign", "sign_key", metavar="KEYFILE", type=click.Path(dir_okay=False),
              help="Sign the new version with this private key (from `pt2reg key generate`): an OMS statement "
                   "naming the model and version, recorded before the aliases are moved.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def push(app: App, bundle: str, name: str, aliases: tuple[str, ...], parents: tuple[str, ...],
         datasets: tuple[str, ...], run_id: str | None, git_commit: str | None, code_uri: str | None,
         sign_key: str | None, as_json: bool) -> None:
    """Publish a bundle as the next version of NAME (prints NAME@N sha256:HEX).

    Blobs are uploaded first; the version, its aliases, lineage and audit event are then
    recorded in one transaction, so an interrupted push never leaves a half-published version.
    Pushing identical content again returns the existing version.
    """
    import os

    size = os.path.getsize(bundle) if os.path.exists(bundle) else 0
    with transfer_progress(size, f"push {name}", enabled=not as_json) as progress:
        result = app.registry.push(bundle, name, aliases=aliases, parents=parents, datasets=datasets,
                                   run_id=run_id, git_commit=git_commit, code_uri=code_uri,
                                   sign_key=sign_key, progress=progress)
    v = result.version
    if as_json:
        emit_json({**version_json(v), "created": result.created, "uploaded_bytes": result.uploaded_bytes,
                   "skipped_bytes": result.skipped_bytes, "warnings": list(result.warnings)})
        return
    for w in result.warnings:
        info(w)
    click.echo(f"{v.name}@{v.number} {v.digest}")


@click.command()
@click.argument("ref")
@click.option("-o", "--output", "out", required=True, type=click.Path(dir_okay=False),
              help="Bundle file to write (atomically; nothing is left behind on failure).")
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB",
              help="Refuse unless signed by one of these public keys (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def pull(app: App, ref: str, out: str, pubkeys: tuple[str, ...], as_json: bool) -> None:
    """Fetch a version (NAME, NAME@N, NAME@ALIAS, NAME@sha256:HEX) and rebuild its bundle file.

    Every byte is written once, into the file: each chunk is checked against its sha256 as it
    is written, and members already verified on this machine are copied from where they lie.
    The cache records where the members lie in the file, so the pinned ref (NAME@sha256:HEX) is
    served from it later, with no database or store, while the file is unchanged.
    """
    reg = app.registry
    where = reg.locate(ref)  # resolved once, here: the progress bar needs the size first
    with transfer_progress(where.size, f"pull {where.label}", enabled=not as_json) as progress:
        result = reg.pull(where, out, progress=progress, require_signature=pubkeys)
    if as_json:
        emit_json({**version_json(result.version), "path": str(result.path), "warnings": list(result.warnings)})
        return
    for w in result.warnings:
        warn(w)
    click.echo(f"{result.path} {result.version.name}@{result.version.number} {result.version.digest}")


@click.command("list")
@click.argument("name", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def list_cmd(app: App, name: str | None, as_json: bool) -> None:
    """List models, or the versions of NAME."""
    from rich.table import Column, Table

    reg = app.registry
    if name is None:
        models = reg.list_models()
        if as_json:
            emit_json({"models": [{"name": m.name, "versions": m.version_count, "latest": m.latest,
                                   "aliases": dict(m.aliases or {})} for m in models]})
            return
        table = Table("model", "versions", "latest", "aliases", box=None, header_style="bold")
        for m in models:
            table.add_row(esc(m.name), str(m.version_count), str(m.latest or "-"),
                          esc(", ".join(f"{a}->{n}" for a, n in sorted((m.aliases or {}).items()))))
        console().print(table)
        return
    versions = reg.list_versions(name)
    if as_json:
        emit_json({"name": name, "versions": [{**version_json(v), "signatures": version_signatures_json(reg, v)}
                                              for v in versions]})
        return
    table = Table("version", "digest", "size", "status", "aliases", Column("created", no_wrap=True), "by",
                  box=None, header_style="bold")
    for v in versions:
        status = v.status if v.status == "active" else f"{v.status}: {v.status_reason}"
        table.add_row(str(v.number), esc(v.digest[:19]), format_size(v.size), esc(status),
                      esc(", ".join(sorted(v.aliases or []))), iso_utc(v.created_at, seconds=True) or "-",
                      esc(v.created_by))
    console().print(table)


@click.command()
@click.argument("ref")
@click.option("--at", "at", metavar="ISO8601", help="For NAME@ALIAS: what the alias pointed to at that time.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def show(app: App, ref: str, at: str | None, as_json: bool) -> None:
    """Show one version: digest, status, aliases, metadata, the publisher's environment,
    signatures, attestations and the OCI artifacts it was pushed as (`pt2reg oci push`).

    With --at, answers from the audit history what NAME@ALIAS pointed to at that time.
    """
    reg = app.registry
    v = reg.show(ref, at=at)
    data = {**version_json(v), "environment": dict(v.environment or {})}
    data["signatures"] = version_signatures_json(reg, v)
    _, attested = reg.attestations(v)
    data["attestations"] = [attestation_json(a) for a in attested]
    pushed = reg.meta.oci_artifacts(v.name, v.number)
    data["oci"] = [a.to_json() for a in pushed]
    if at is not None:
        data.update(ref=ref, at=at)
    if as_json:
        emit_json(data)
        return
    out = console()
    when = f"  ({esc(ref)} at {esc(at)})" if at is not None else ""
    out.print(f"[bold]{esc(v.name)}@{v.number}[/bold]  {esc(v.digest)}{when}")
    out.print(f"status: {esc(v.status + (': ' + v.status_reason if v.status_reason else ''))}")
    out.print(f"size: {format_size(v.size)}   created: {esc(iso_utc(v.created_at, seconds=True) or '-')} by {esc(v.created_by)}")
    if data["aliases"]:
        out.print("aliases: " + esc(", ".join(data["aliases"])))
    for k, val in sorted(data["metadata"].items()):
        out.print(f"  {esc(k)} = {esc(val)}")
    env = data["environment"]
    if env:
        out.print("published with: " + esc(", ".join(f"{k} {val}" for k, val in sorted(env.items()) if val)))
    for sig in data["signatures"]:
        out.print(esc(sig["text"]))
    if attested:
        print_attestations(attested)
    for a in pushed:
        tag = f" (tag {a.tag})" if a.tag else ""
        out.print(f"OCI: {esc(a.reference)}{esc(tag)}  pushed {iso_utc(a.pushed_at, seconds=True)} by {esc(a.pushed_by)}")


@click.group()
def alias() -> None:
    """Move or remove aliases (mutable, audited pointers such as prod or staging)."""


@alias.command("set")
@click.argument("name")
@click.argument("alias_name", metavar="ALIAS")
@click.argument("ref", metavar="REF")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def alias_set(app: App, name: str, alias_name: str, ref: str, as_json: bool) -> None:
    """Point NAME@ALIAS at REF (a version number, alias or digest of NAME)."""
    v = app.registry.set_alias(name, alias_name, ref)
    if as_json:
        emit_json({"name": name, "alias": alias_name, "version": v.number, "digest": v.digest})
        return
    click.echo(f"{name}@{alias_name} -> {name}@{v.number} {v.digest}")


@alias.command("rm")
@click.argument("name")
@click.argument("alias_name", metavar="ALIAS")
@pass_app
def alias_rm(app: App, name: str, alias_name: str) -> None:
    """Remove alias ALIAS of NAME."""
    app.registry.remove_alias(name, alias_name)
    click.echo(f"removed {name}@{alias_name}")


def _status_command(status: str, help_text: str) -> Any:
    @click.argument("ref")
    @click.option("--reason", required=True, metavar="TEXT", help="Why (recorded in the audit trail).")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
    @pass_app
    def command(app: App, ref: str, reason: str, as_json: bool) -> None:
        v = app.registry.set_status(ref, status, reason)
        if as_json:
            emit_json(version_json(v))
            return
        click.echo(f"{v.name}@{v.number} {status}: {reason}")

    command.__doc__ = help_text
    return command


deprecate = click.command("deprecate")(_status_command(
    "deprecated", "Mark a version deprecated (still resolvable; pulls warn)."))
yank = click.command("yank")(_status_command(
    "yanked", "Yank a version: NAME (latest) skips it; a pinned ref still works and warns."))


@click.command()
@click.option("--dry-run", is_flag=True, help="Only report what would be deleted.")
@click.option("--grace", "grace", type=float, default=0.0, metavar="SECONDS", show_default=True,
              help="Keep unreferenced blobs younger than this.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def gc(app: App, dry_run: bool, grace: float, as_json: bool) -> None:
    """Reclaim blobs that no version references (e.g. from an interrupted push).

    Blobs claimed by a push still in progress (its process alive, or heartbeating from another
    host) are never deleted.
    """
    result = app.registry.gc(dry_run=dry_run, grace_seconds=grace)
    if as_json:
        emit_json({"dry_run": dry_run, "deleted": [{"digest": d, "size": s} for d, s in result.deleted],
                   "reclaimed_bytes": result.reclaimed_bytes, "kept_in_flight": result.kept_claimed,
                   "aborted_uploads": result.aborted_uploads, "released_claims": result.released_claims})
        return
    verb = "would delete" if dry_run else "deleted"
    click.echo(f"{verb} {len(result.deleted)} blob(s), {format_size(result.reclaimed_bytes)}"
               + (f"; kept {result.kept_claimed} claimed by pushes in progress" if result.kept_claimed else "")
               + (f"; {'would abort' if dry_run else 'aborted'} {len(result.aborted_uploads)} abandoned "
                  f"upload(s)" if result.aborted_uploads else ""))


@click.group()
def db() -> None:
    """Metadata database maintenance."""


@db.command("upgrade")
@pass_app
def db_upgrade(app: App) -> None:
    """Migrate the metadata database to the latest schema (Alembic)."""
    from ..store import make_engine, upgrade

    app.require_direct("db upgrade")
    before, after = upgrade(make_engine(app.settings.db_url))
    click.echo(f"database at {after}" + (f" (was {before or 'empty'})" if before != after else " (already current)"))




@click.command()
@click.argument("ref", metavar="REF")
@click.option("--key", "key_path", required=True, metavar="KEYFILE", type=click.Path(dir_okay=False),
              help="Private key (from `pt2reg key generate`; ECDSA signatures also verify with model_signing).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def sign(app: App, ref: str, key_path: str, as_json: bool) -> None:
    """Sign a published version: an OMS statement naming its model, version, digest and the time.

    The members are fetched and verified first (the statement lists their file digests, as
    OpenSSF Model Signing lists a model directory). Recorded beside the version, audited as
    `sign` (through a server with a push token); a legacy signature by the same key is replaced.
    """
    reg = app.registry
    record = reg.sign(ref, key_path)
    version = reg.resolve(ref)
    if as_json:
        emit_json({"name": version.name, "version": version.number, "digest": version.digest,
                   "key_id": record.key_id, "algorithm": record.algorithm})
        return
    click.echo(f"signed {version.name}@{version.number} {version.digest} with {record.key_id[:19]}... "
               f"({record.algorithm})")


COMMANDS = [push, pull, list_cmd, show, alias, deprecate, yank, gc, db, sign]
