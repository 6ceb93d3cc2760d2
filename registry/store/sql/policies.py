"""``GovernanceStore`` over SQL: alias policies and attestations (``registry.store.governance``)."""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ...access.policy import (
    ROLE_SCOPES,
    AliasPolicy,
    attestation_digest,
    attestation_statement,
    validate_label,
)
from ...errors import SignatureError, UsageError
from ...format.signing import key_id_of, public_key_from_pem
from ...refs import (
    validate_alias,
    validate_name,
)
from .. import governance
from ..orm import (
    VersionRow,
    json_text,
)
from ..records import (
    AttestationRecord,
)
from ._base import SqlStoreBase, _audit_details

__all__ = ["SqlGovernanceStore"]


class SqlGovernanceStore(SqlStoreBase):
    """Alias policies and conformance attestations."""

    def set_policy(self, name: str, alias: str, *, role_scope: str | None = None,
                   signers: Sequence[str] = (), attestations: Sequence[str] = (),
                   immutable: bool = False, actor: str, host: str,
                   audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        """Create or replace the policy on ``name@alias`` (``registry.access.policy``):
        ``role_scope`` (an action or ``admin``), ``signers`` (Ed25519 public keys as PEM text:
        one of them must have signed a version the alias points at), ``attestations`` (labels
        a version must have passed), ``immutable``. Audited as ``policy.set``; an immutable
        policy whose alias is set cannot be changed (PolicyError, exit 7).

        For example (``store`` an open ``SqlMetadataStore``)::

            store.set_policy("team/m", "prod", signers=[pem], attestations=["cpu-ci"],
                             actor="ana", host="laptop").describe()   # -> 'signed by sha256:...; attested cpu-ci'
        """
        validate_name(name)
        validate_alias(alias)
        if role_scope is not None and role_scope not in ROLE_SCOPES:
            raise UsageError(f"invalid role scope {role_scope!r}", hint=f"one of {', '.join(ROLE_SCOPES)}")
        keys = [(key_id_of(public_key_from_pem(pem.encode("ascii", "replace"), f"policy key #{i + 1}")),
                 pem.strip() + "\n") for i, pem in enumerate(signers)]
        keys = list(dict((k, pem) for k, pem in keys).items())
        labels = list(dict.fromkeys(validate_label(a) for a in attestations))
        extra = _audit_details(audit_details)
        return self._write(lambda s: governance.set_policy(
            s, name, alias, role_scope=role_scope, signers=keys, attestations=labels,
            immutable=immutable, actor=actor, host=host, extra=extra))

    def remove_policy(self, name: str, alias: str, *, actor: str, host: str,
                      audit_details: Mapping[str, Any] | None = None) -> AliasPolicy:
        """Delete the policy on ``name@alias``; returns it (audited ``policy.remove``).
        NotFoundError if there is none; PolicyError for an immutable one whose alias is set."""
        validate_name(name)
        validate_alias(alias)
        extra = _audit_details(audit_details)
        return self._write(lambda s: governance.remove_policy(s, name, alias, actor=actor, host=host,
                                                              extra=extra))

    def policies(self, name: str) -> list[AliasPolicy]:
        """The alias policies of model ``name``, by alias (a model need not exist yet).

        For example (``store`` an open ``SqlMetadataStore``)::

            [p.alias for p in store.policies("team/m")]   # -> ['prod']
        """
        validate_name(name)
        return self._read(lambda s: governance.policies(s, name))

    def record_attestation(self, name: str, number: int, *, label: str, passed: bool, device: str,
                           target: Mapping[str, Any], results: Sequence[Any], error: str | None = None,
                           signature: Mapping[str, Any] | None = None, public_key: str | None = None,
                           actor: str, host: str,
                           audit_details: Mapping[str, Any] | None = None) -> AttestationRecord:
        """Record a conformance attestation of ``name@number`` (audited ``attestation.record``).

        A signed one carries ``signature`` (``sign_digest`` over
        ``attestation_digest(attestation_statement(...))`` of these very fields and the
        version's digest) and the signer's ``public_key`` (PEM); the signature is verified
        here, SignatureError (exit 5) when it does not hold.
        """
        validate_label(label)
        if not isinstance(device, str) or not device or len(device) > 64:
            raise UsageError(f"invalid device {device!r}")
        if (signature is None) != (public_key is None):
            raise UsageError("a signed attestation needs both its signature and its public key")
        target_json = json_text(dict(target), "attestation target")
        results_json = json_text(list(results), "attestation results")
        extra = _audit_details(audit_details)

        def work(s: Session) -> AttestationRecord:
            version = self._version(s, self._model(s, name), number)
            key_id = sig_text = None
            if signature is not None and public_key is not None:
                statement = attestation_statement(
                    digest=version.digest, label=label, passed=passed, device=device,
                    target=json.loads(target_json), results=json.loads(results_json), error=error)
                wanted = attestation_digest(statement)
                if signature.get("digest") not in (None, wanted):
                    raise SignatureError(f"the attestation's signature is for {str(signature.get('digest'))[:80]}, "
                                         f"not for this statement ({wanted})",
                                         hint="the attestation was changed after it was signed")
                key_id = governance.check_attestation_signature(wanted, signature, public_key)
                sig_text = str(signature.get("signature"))
            return governance.record_attestation(
                s, name, version, label=label, passed=passed, device=device,
                target_json=target_json, results_json=results_json, error=error, key_id=key_id,
                signature=sig_text, public_key=public_key if key_id else None, actor=actor,
                host=host, extra=extra)

        return self._write(work)

    def attestations(self, name: str, number: int) -> list[AttestationRecord]:
        """The attestations of ``name@number``, oldest first.

        For example (``store`` an open ``SqlMetadataStore``)::

            [(a.label, a.passed) for a in store.attestations("team/m", 4)]   # -> [('cpu-ci', True)]
        """
        return self._read(lambda s: governance.attestations(
            s, name, self._version(s, self._model(s, name), number)))

    def attestation_counts(self, name: str) -> dict[int, tuple[int, int]]:
        """``version number -> (attestations passed, attestations in all)`` for the attested
        versions of a model, in one query (the web page's versions table)."""
        from ..orm import AttestationRow

        def work(s: Session) -> dict[int, tuple[int, int]]:
            model = self._model(s, name)
            rows = s.execute(select(VersionRow.number, AttestationRow.passed, func.count(AttestationRow.id))
                             .join(AttestationRow, AttestationRow.version_id == VersionRow.id)
                             .where(VersionRow.model_id == model.id)
                             .group_by(VersionRow.number, AttestationRow.passed))
            out: dict[int, tuple[int, int]] = {}
            for number, passed, count in rows:
                ok, total = out.get(number, (0, 0))
                out[number] = (ok + (count if passed else 0), total + count)
            return out

        return self._read(work)
