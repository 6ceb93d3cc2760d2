"""Alias policies and attestations in SQL, inside the store's transactions.

Every path that moves or removes an alias (``SqlMetadataStore.set_alias``, ``publish`` with
aliases, ``remove_alias``; the server calls the same methods) reaches :func:`enforce_move` /
:func:`enforce_remove` in the transaction that would make the change, so a refused move
records nothing. The rules themselves are pure code (:mod:`registry.access.policy`); this
module gathers their facts: the policy row, which policy keys validly signed the version,
and the version's attestations per label.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from ..access.policy import AliasPolicy, Attested, check_move, check_remove
from ..access.scopes import Identity
from ..errors import NotFoundError, PolicyError, SignatureError
from ..format.signing import key_id_of, public_key_from_pem, valid_signer
from .audit_chain import parse_ts
from .audit_log import append_event
from .orm import AliasPolicyRow, AliasRow, AttestationRow, ModelRow, SignatureRow, VersionRow, json_text, now_text
from .records import AttestationRecord

__all__ = ["to_policy", "enforce_move", "enforce_remove", "set_policy", "remove_policy",
           "policies", "record_attestation", "attestations", "check_attestation_signature"]


def to_policy(row: AliasPolicyRow) -> AliasPolicy:
    return AliasPolicy(row.model, row.alias, row.role_scope,
                       tuple((k, pem) for k, pem in json.loads(row.signers_json)),
                       tuple(json.loads(row.attestations_json)), bool(row.immutable),
                       parse_ts(row.updated_at), row.updated_by)


def _policy_row(s: Session, name: str, alias: str) -> AliasPolicyRow | None:
    return s.scalars(select(AliasPolicyRow).where(AliasPolicyRow.model == name,
                                                  AliasPolicyRow.alias == alias)).one_or_none()


def _signers(s: Session, policy: AliasPolicy, version: VersionRow) -> set[str]:
    """The policy keys with a valid signature over the version (checked now, with the keys
    the policy holds: a recorded signature is only checked for its form). A statement
    signature must name this model and version (one signed for team/debug moves no alias of
    team/m); a legacy bare-digest one still counts here (README "Threat model")."""
    if not policy.signers:
        return set()
    sigs = [{"key_id": r.key_id, "algorithm": r.algorithm, "signature": r.signature}
            for r in s.scalars(select(SignatureRow).where(SignatureRow.version_id == version.id))]
    keys = {k: public_key_from_pem(pem.encode("ascii"), f"policy key {k}") for k, pem in policy.signers}
    signer, _ = valid_signer(version.digest, sigs, keys, name=policy.name, version=version.number)
    return {signer} if signer else set()


def _attested(s: Session, policy: AliasPolicy, version: VersionRow) -> dict[str, Attested]:
    found: dict[str, Attested] = {}
    if not policy.attestations:
        return found
    for label, passed, key_id in s.execute(
            select(AttestationRow.label, AttestationRow.passed, AttestationRow.key_id)
            .where(AttestationRow.version_id == version.id,
                   AttestationRow.label.in_(list(policy.attestations)))):
        was = found.get(label, Attested())
        found[label] = Attested(passed=was.passed or bool(passed), failed=was.failed or not passed,
                                signed_by=was.signed_by | ({key_id} if passed and key_id else set()))
    return found


def enforce_move(s: Session, name: str, alias: str, version: VersionRow, current: int | None,
                 identity: Identity | None) -> None:
    """PolicyError when the policy on ``name@alias`` (if any) forbids pointing it at
    ``version`` (``current``: the version number it points at now, None when unset)."""
    row = _policy_row(s, name, alias)
    if row is None:
        return
    policy = to_policy(row)
    check_move(policy, number=version.number, current=current, identity=identity,
               signers=_signers(s, policy, version), attested=_attested(s, policy, version))


def enforce_remove(s: Session, name: str, alias: str, current: int,
                   identity: Identity | None) -> None:
    """PolicyError when the policy on ``name@alias`` forbids removing it."""
    row = _policy_row(s, name, alias)
    if row is not None:
        check_remove(to_policy(row), current=current, identity=identity)


def _alias_is_set(s: Session, name: str, alias: str) -> bool:
    return s.scalar(select(AliasRow.id).join(ModelRow, ModelRow.id == AliasRow.model_id)
                    .where(ModelRow.name == name, AliasRow.alias == alias)) is not None


def _lock_model(s: Session, name: str) -> None:
    """Lock the model's row, when it exists, as every alias move does: a policy change and a
    move of the same model never interleave (PostgreSQL; SQLite serializes writers anyway)."""
    s.scalars(select(ModelRow.id).where(ModelRow.name == name).with_for_update()).one_or_none()


def _locked_immutable(s: Session, row: AliasPolicyRow | None, verb: str) -> None:
    if row is not None and row.immutable and _alias_is_set(s, row.model, row.alias):
        raise PolicyError(f"alias {row.alias} of {row.model} is immutable and set; its policy "
                          f"cannot be {verb}", rule="immutable")


def set_policy(s: Session, name: str, alias: str, *, role_scope: str | None,
               signers: Sequence[tuple[str, str]], attestations: Sequence[str], immutable: bool,
               actor: str, host: str, extra: Mapping[str, Any] | None) -> AliasPolicy:
    """Create or replace the policy on ``name@alias`` (audited ``policy.set``). An immutable
    policy whose alias is set cannot be changed (PolicyError)."""
    _lock_model(s, name)
    row = _policy_row(s, name, alias)
    _locked_immutable(s, row, "changed")
    now = now_text(s)
    if row is None:
        row = AliasPolicyRow(model=name, alias=alias)
        s.add(row)
    row.role_scope = role_scope
    row.signers_json = json_text([list(p) for p in signers], "policy signers")
    row.attestations_json = json_text(list(attestations), "policy attestations")
    row.immutable = bool(immutable)
    row.updated_at, row.updated_by = now, actor
    s.flush()
    append_event(s, "policy.set", actor=actor, host=host, model=name,
                 details={"alias": alias, "role_scope": role_scope, "immutable": bool(immutable),
                          "signers": [k for k, _ in signers], "attestations": list(attestations)},
                 extra=extra)
    return to_policy(row)


def remove_policy(s: Session, name: str, alias: str, *, actor: str, host: str,
                  extra: Mapping[str, Any] | None) -> AliasPolicy:
    """Delete the policy on ``name@alias`` (audited ``policy.remove``); NotFoundError if none,
    PolicyError for an immutable one whose alias is set."""
    _lock_model(s, name)
    row = _policy_row(s, name, alias)
    if row is None:
        raise NotFoundError(f"alias {alias} of {name} has no policy", what="policy", name=name)
    _locked_immutable(s, row, "removed")
    policy = to_policy(row)
    s.delete(row)
    append_event(s, "policy.remove", actor=actor, host=host, model=name, details={"alias": alias},
                 extra=extra)
    return policy


def policies(s: Session, name: str) -> list[AliasPolicy]:
    return [to_policy(r) for r in s.scalars(select(AliasPolicyRow).where(AliasPolicyRow.model == name)
                                           .order_by(AliasPolicyRow.alias))]


def _to_record(row: AttestationRow, name: str, version: VersionRow) -> AttestationRecord:
    return AttestationRecord(
        id=row.id, name=name, number=version.number, digest=version.digest, label=row.label,
        passed=bool(row.passed), device=row.device, target=json.loads(row.target_json),
        results=json.loads(row.results_json), created_at=parse_ts(row.created_at),
        created_by=row.created_by, error=row.error, key_id=row.key_id, signature=row.signature)


def check_attestation_signature(statement_digest: str, signature: Mapping[str, Any],
                                public_key: str) -> str:
    """The key id of a valid signature over ``statement_digest`` by ``public_key`` (PEM);
    SignatureError (exit 5) otherwise."""
    key = public_key_from_pem(public_key.encode("ascii", "replace"), "the attestation's public key")
    key_id = key_id_of(key)
    if signature.get("key_id") != key_id:
        raise SignatureError("the attestation's signature names another key than the public key sent with it")
    signer, why = valid_signer(statement_digest, [dict(signature)], {key_id: key})
    if signer is None:
        raise SignatureError(f"the attestation's signature does not verify: {why}",
                             hint="sign it with the private key of that public key")
    return signer


def record_attestation(s: Session, name: str, version: VersionRow, *, label: str,
                       passed: bool, device: str, target_json: str, results_json: str,
                       error: str | None, key_id: str | None, signature: str | None,
                       public_key: str | None, actor: str, host: str,
                       extra: Mapping[str, Any] | None) -> AttestationRecord:
    """Insert an attestation (its signature already verified) and audit it
    (``attestation.record``)."""
    row = AttestationRow(version_id=version.id, label=label, passed=bool(passed), device=device,
                         target_json=target_json, results_json=results_json, error=error,
                         key_id=key_id, signature=signature, public_key=public_key,
                         created_at=now_text(s), created_by=actor)
    s.add(row)
    s.flush()
    append_event(s, "attestation.record", actor=actor, host=host, model=name, number=version.number,
                 digest=version.digest, details={"label": label, "passed": bool(passed), "id": row.id,
                                                 "key_id": key_id}, extra=extra)
    return _to_record(row, name, version)


def attestations(s: Session, name: str, version: VersionRow) -> list[AttestationRecord]:
    return [_to_record(r, name, version) for r in s.scalars(
        select(AttestationRow).where(AttestationRow.version_id == version.id).order_by(AttestationRow.id))]
