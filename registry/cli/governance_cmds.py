"""``pt2reg policy``, ``pt2reg attest`` and ``pt2reg attestations``: protected aliases and
conformance attestations.

A policy is enforced by the registry itself, in the transaction of every alias move (the
server, a direct database, ``push --alias``): a move it refuses exits 7 with one line naming
the rule and the version.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import click

from ..format.times import iso_utc
from ._core import DEVICE, App, emit_json, pass_app
from .render import console, esc, print_attestations
from .runtime_cmds import _IMPORT_HELP, _LIBRARY_HELP, _NATIVE_HELP
from .views import attestation_json, policy_json

if TYPE_CHECKING:
    from ..runtime.device import Device

__all__ = ["policy", "attest", "attestations"]

_ROLE_HELP = ("Only a token holding this action on the model (model:<glob>:ACTION), or admin, may move or "
              "remove the alias (pull, push, alias, yank, delete, attest, admin).")


@click.group()
def policy() -> None:
    """Rules on an alias (e.g. prod): who may move it, and what a version needs first.

    \b
    pt2reg policy set team/m prod --require-signature ci.pub --require-attestation cpu-ci
    pt2reg policy set team/m stable-2026q4 --immutable
    \b
    --require-signature PUB   the version must carry a valid signature by one of these keys
                              (repeatable: any one suffices); attestations required too must
                              then be signed by one of them
    --require-attestation L   the version must have a passed attestation labelled L
                              (`pt2reg attest REF --label L`); failed ones never count
    --role-scope ACTION       the token must hold ACTION on the model (or admin)
    --immutable               the alias is set once, then never moved or removed
    Changes need direct database access or an admin token, and are audited. A move a policy
    refuses exits 7 naming the rule and the version.
    """


@policy.command("set")
@click.argument("name")
@click.argument("alias_name", metavar="ALIAS")
@click.option("--role-scope", metavar="ACTION", help=_ROLE_HELP)
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB.pub",
              help="Public key file; a version must be signed by one of them (repeatable).")
@click.option("--require-attestation", "labels", multiple=True, metavar="LABEL",
              help="A version must have a passed attestation with this label (repeatable).")
@click.option("--immutable", is_flag=True, help="The alias can be set once and never moved or removed.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def policy_set(app: App, name: str, alias_name: str, role_scope: str | None, pubkeys: tuple[str, ...],
               labels: tuple[str, ...], immutable: bool, as_json: bool) -> None:
    """Create or replace the policy on NAME@ALIAS (the model need not exist yet)."""
    p = app.registry.set_policy(name, alias_name, role_scope=role_scope, require_signature=pubkeys,
                                require_attestation=labels, immutable=immutable)
    if as_json:
        emit_json({"policy": policy_json(p)})
        return
    click.echo(f"policy on {p.name}@{p.alias}: {p.describe()}")


@policy.command("show")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def policy_show(app: App, name: str, as_json: bool) -> None:
    """The policies on NAME's aliases."""
    found = app.registry.policies(name)
    if as_json:
        emit_json({"name": name, "policies": [policy_json(p) for p in found]})
        return
    if not found:
        click.echo(f"{name} has no alias policies")
        return
    from rich.table import Column, Table

    table = Table("alias", "rules", Column("updated", no_wrap=True), "by", box=None, header_style="bold")
    for p in found:
        table.add_row(esc(p.alias), esc(p.describe()), iso_utc(p.updated_at, seconds=True) or "-",
                      esc(p.updated_by or "-"))
    console().print(table)


@policy.command("rm")
@click.argument("name")
@click.argument("alias_name", metavar="ALIAS")
@pass_app
def policy_rm(app: App, name: str, alias_name: str) -> None:
    """Remove the policy on NAME@ALIAS (not possible for an immutable alias that is set)."""
    p = app.registry.remove_policy(name, alias_name)
    click.echo(f"removed the policy on {p.name}@{p.alias} ({p.describe()})")


@click.command()
@click.argument("ref")
@click.option("--label", required=True, metavar="LABEL", help="What this run attests, e.g. cpu-ci or h100.")
@click.option("--device", type=DEVICE, metavar="DEV", help="Device to run on (default: cuda:0 if available, else cpu).")
@click.option("--sign", "sign_key", metavar="KEY", type=click.Path(dir_okay=False),
              help="Sign the attestation with this Ed25519 private key (`pt2reg key generate`).")
@click.option("--import", "imports", multiple=True, metavar="MODULE", help=_IMPORT_HELP)
@click.option("--load-library", "libraries", multiple=True, metavar="PATH.so", help=_LIBRARY_HELP)
@click.option("--require-signature", "pubkeys", multiple=True, metavar="PUB",
              help="Require a valid signature by this public key before anything runs (repeatable).")
@click.option("--trust-pickle", is_flag=True, help="Allow programs whose files hold pickled data.")
@click.option("--trust-native", is_flag=True, help=_NATIVE_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def attest(app: App, ref: str, label: str, device: Device | None, sign_key: str | None, imports: tuple[str, ...],
           libraries: tuple[str, ...], pubkeys: tuple[str, ...], trust_pickle: bool, trust_native: bool,
           as_json: bool) -> None:
    """Verify REF and run its golden samples on this machine, and record the outcome as an
    attestation LABEL of that version: the probed target (torch, device, compute capability,
    CUDA and driver), per-output max abs/rel error, pass/fail, who and when; signed with
    --sign KEY (the registry verifies the signature on record).

    A failed run (not compatible, a load error, a sample outside tolerance, no golden samples)
    is recorded as a failed attestation and exits 1; failed attestations never satisfy a
    policy. Against a server the token needs model:<glob>:attest.
    """
    from ..access.policy import validate_label
    from ..errors import RegistryError
    from ..runtime.attest import run_attestation

    validate_label(label)
    if sign_key is not None:  # a bad key fails now, not after the samples ran
        from ..format.signing import public_pem_of

        public_pem_of(sign_key)
    run = run_attestation(app.registry, ref, device=device, imports=imports, libraries=libraries,
                          require_signature=pubkeys, trust_pickle=trust_pickle, trust_native=trust_native)
    record = app.registry.record_attestation(run.version, label=label, passed=run.passed, device=run.device,
                                             target=run.target, results=run.results, error=run.error,
                                             sign_key=sign_key)
    if as_json:
        emit_json({"attestation": attestation_json(record)})
    else:
        print_attestations([record], title=f"attestation of {esc(record.name)}@{record.number}")
    if not record.passed:
        raise RegistryError(f"attestation {label!r} of {record.name}@{record.number} failed "
                            f"(recorded as id {record.id}): {record.error}")


@click.command()
@click.argument("ref")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@pass_app
def attestations(app: App, ref: str, as_json: bool) -> None:
    """The attestations recorded for the version REF names, oldest first."""
    version, found = app.registry.attestations(ref)
    if as_json:
        emit_json({"ref": f"{version.name}@{version.number}", "digest": version.digest,
                   "attestations": [attestation_json(a) for a in found]})
        return
    if not found:
        click.echo(f"{version.name}@{version.number} has no attestations")
        return
    print_attestations(found, title=f"attestations of {esc(version.name)}@{version.number}")


COMMANDS = [policy, attest, attestations]
