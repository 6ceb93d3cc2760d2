"""Alias policies and conformance attestations as pure rules: what a move must satisfy.

A policy guards one alias of one model (``team/m@prod``)::

    role_scope     the token moving or removing it must hold this action on the model
                   (``model:<glob>:<action>``, or ``admin``); direct database access is admin
    signers        the version must carry a valid Ed25519 signature by one of these keys
    attestations   the version must have a *passed* attestation for each label; when the
                   policy names signers, the attestation must be signed by one of them too
    immutable      the alias may be set once, then never moved or removed (by anyone)

The store (``registry.store.governance``) gathers the facts inside the transaction that
moves the alias and calls :func:`check_move` / :func:`check_remove`; the first broken rule
is a :class:`~registry.errors.PolicyError` (exit 7) naming the rule and the version::

    >>> p = AliasPolicy("team/m", "prod", attestations=("cpu-ci",))
    >>> check_move(p, number=4, current=3, identity=None, signers=set(), attested={})
    Traceback (most recent call last):
    registry.errors.PolicyError: alias prod of team/m needs an attestation for 'cpu-ci'; version 4 has none (run ...)

An attestation's signature covers :func:`attestation_digest` of its statement (the version
digest, label, verdict, device, target and results), signed with the bundle signing helpers
of :mod:`registry.format.signing`; the statement's ``kind`` keeps it apart from a bundle.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from ..digests import canonical_json
from ..errors import PolicyError, UsageError
from .scopes import ACTIONS, ADMIN, Identity

__all__ = ["AliasPolicy", "ROLE_SCOPES", "ATTESTATION_KIND", "check_move", "check_remove",
           "validate_label", "attestation_statement", "attestation_digest", "Attested"]

ROLE_SCOPES = (*ACTIONS, ADMIN)
ATTESTATION_KIND = "pt2-registry/attestation/v1"
_LABEL = re.compile(r"[a-z0-9][a-z0-9_.\-]{0,63}\Z")


def validate_label(label: str) -> str:
    """An attestation label (``cpu-ci``, ``h100``): lower-case letters, digits, ``._-``."""
    if not isinstance(label, str) or not _LABEL.match(label):
        raise UsageError(f"invalid attestation label {label!r}",
                         hint="1-64 characters: a-z, 0-9, '.', '_', '-', starting with a letter or digit")
    return label


@dataclass(frozen=True)
class AliasPolicy:
    """The rules on ``name@alias``. ``signers``: ``(key id, public key PEM)`` pairs."""

    name: str
    alias: str
    role_scope: str | None = None
    signers: tuple[tuple[str, str], ...] = ()
    attestations: tuple[str, ...] = ()
    immutable: bool = False
    updated_at: datetime | None = None
    updated_by: str | None = None

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(k for k, _ in self.signers)

    def describe(self) -> str:
        """One line: ``immutable; role admin; signed by sha256:ab12...; attested cpu-ci``."""
        parts = []
        if self.immutable:
            parts.append("immutable")
        if self.role_scope:
            parts.append(f"role {self.role_scope}")
        if self.signers:
            parts.append("signed by " + " or ".join(_short(k) for k in self.key_ids))
        if self.attestations:
            parts.append("attested " + ", ".join(self.attestations))
        return "; ".join(parts) or "no rules"


@dataclass(frozen=True)
class Attested:
    """What the registry holds for one label of a version: whether any attestation passed,
    and the key ids that signed the passed ones."""

    passed: bool = False
    failed: bool = False
    signed_by: frozenset[str] = field(default_factory=frozenset)


def _short(key_id: str) -> str:
    return key_id[:19] + "..."


def _where(p: AliasPolicy) -> str:
    return f"alias {p.alias} of {p.name}"


def _check_role(p: AliasPolicy, identity: Identity | None, verb: str) -> None:
    if p.role_scope is None or identity is None:  # no token: direct database access is admin
        return
    if identity.allows(p.role_scope, p.name):
        return
    needed = p.role_scope if p.role_scope == ADMIN else f"model:{p.name}:{p.role_scope}"
    raise PolicyError(f"{_where(p)} may be {verb} only by a token with scope {needed}; token "
                      f"{identity.owner!r} (id {identity.token_id}) lacks it", rule="role-scope",
                      hint="ask an admin for a token with that scope")


def check_move(p: AliasPolicy, *, number: int, current: int | None, identity: Identity | None,
               signers: set[str], attested: Mapping[str, Attested]) -> None:
    """PolicyError unless ``p`` lets its alias point at version ``number`` (``current``: where
    it points now, None when unset). ``signers``: key ids with a valid signature over the
    version; ``attested``: label -> :class:`Attested` for the version."""
    if p.immutable and current is not None:
        raise PolicyError(f"{_where(p)} is immutable; it points at version {current} and cannot be "
                          f"moved to version {number}", rule="immutable")
    _check_role(p, identity, "moved")
    if p.signers and not signers & set(p.key_ids):
        keys = " or ".join(_short(k) for k in p.key_ids)
        raise PolicyError(f"{_where(p)} needs a signature by {keys}; version {number} has none",
                          rule="signature", hint="push the same bundle again with --sign KEY to sign it")
    for label in p.attestations:
        found = attested.get(label, Attested())
        if not found.passed:
            what = "only failed ones" if found.failed else "none"
            raise PolicyError(f"{_where(p)} needs an attestation for {label!r}; version {number} "
                              f"has {what}", rule="attestation",
                              hint=f"run `pt2reg attest REF --label {label}` on the target")
        if p.signers and not found.signed_by & set(p.key_ids):
            keys = " or ".join(_short(k) for k in p.key_ids)
            raise PolicyError(f"{_where(p)} needs an attestation for {label!r} signed by {keys}; "
                              f"version {number} has none so signed", rule="attestation",
                              hint=f"run `pt2reg attest REF --label {label} --sign KEY`")


def check_remove(p: AliasPolicy, *, current: int, identity: Identity | None) -> None:
    """PolicyError unless ``p`` lets its alias (at version ``current``) be removed."""
    if p.immutable:
        raise PolicyError(f"{_where(p)} is immutable; it points at version {current} and cannot be "
                          f"removed", rule="immutable")
    _check_role(p, identity, "removed")


def attestation_statement(*, digest: str, label: str, passed: bool, device: str,
                          target: Mapping[str, Any], results: list[Any], error: str | None
                          ) -> dict[str, Any]:
    """What an attestation says, as the JSON its signature covers."""
    return {"kind": ATTESTATION_KIND, "digest": digest, "label": label, "passed": bool(passed),
            "device": device, "target": dict(target), "results": list(results), "error": error}


def attestation_digest(statement: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the statement's canonical JSON: the message an attester signs."""
    return "sha256:" + hashlib.sha256(canonical_json(dict(statement))).hexdigest()
