"""The CLI's JSON documents: a version, a lineage node, an audit event, and the inspect view of a
bundle (file or registry ref). One shape per record, so ``--json`` output (and a server that
answers with the same documents) cannot drift apart."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..format.times import iso_utc

if TYPE_CHECKING:  # the bundle format loads only in the views that read a bundle (list/show never do)
    from ..access.policy import AliasPolicy
    from ..format.manifest import Manifest
    from ..store.records import AttestationRecord, AuditEvent, LineageNode, VersionRecord

__all__ = ["inspect_source", "bundle_view", "version_json", "node_json", "event_json", "policy_json",
           "attestation_json", "signatures_json", "version_signatures_json"]


def bundle_view(manifest: Manifest, **extra: Any) -> dict[str, Any]:
    """``inspect --json``: the manifest as JSON (its ``to_json()``), its digest, size and warnings."""
    from ..format.manifest import baked_device_groups

    view = {"digest": manifest.digest, "size": manifest.total_size, **manifest.to_json(),
            "warnings": manifest.warnings(),
            # what the warnings say, as data: per program, one entry per device and source line
            "baked_device_groups": {name: [g.to_json() for g in baked_device_groups(prog.baked_devices)]
                                    for name, prog in manifest.programs.items() if prog.baked_devices}}
    view.update(extra)
    return view


def inspect_source(target: str, registry: Callable[[], Any]) -> tuple[Manifest, dict[str, Any]]:
    """The manifest of a bundle file (verified member by member) or a registry ref (from the
    metadata only), and what the view says besides (``path`` or ``ref``, build, signatures...)."""
    from ..client.sources import parse_source
    from ..format.bundle import BundleFile
    from ..format.manifest import Manifest
    from ..oci.reference import OciReference
    from ..refs import Ref

    where = parse_source(target)  # a file must exist (exit 3); oci://... an OCI artifact; anything else is a ref
    if isinstance(where, OciReference):  # its manifest and bundle layer only: no weight is downloaded
        from ..client.oci import describe_artifact

        pinned, src = describe_artifact(registry(), where, allow_tag=True)
        return src.manifest, {"ref": str(pinned), "name": src.name, "version": src.version,
                              "signatures": src.signatures}
    if not isinstance(where, Ref):
        bundle = BundleFile.open(where)
        bundle.verify()
        return bundle.manifest, {"path": str(target), "build": bundle.build, "signatures": bundle.signatures}
    version = registry().resolve(where)  # the metadata only: no blob is downloaded
    manifest = Manifest.from_bytes(version.manifest_json.encode("utf-8"))
    return manifest, {"ref": f"{version.name}@{version.number}", "name": version.name,
                      "version": version.number, "status": version.status}


def version_json(v: VersionRecord) -> dict[str, Any]:
    return {
        "name": v.name, "version": v.number, "digest": v.digest, "size": v.size,
        "status": v.status, "status_reason": v.status_reason,
        "created_at": iso_utc(v.created_at), "created_by": v.created_by,
        "aliases": sorted(v.aliases or []), "metadata": dict(v.metadata or {}),
    }


def version_signatures_json(registry: Any, v: VersionRecord) -> list[dict[str, Any]]:
    """``signatures_json`` of a published version (its recorded signatures)."""
    return signatures_json(registry, digest=v.digest, name=v.name, version=v.number,
                           signatures=[r.to_json() for r in registry.meta.signatures(v.name, v.number)])


def signatures_json(registry: Any, *, digest: str, name: str | None, version: int | None,
                    signatures: Any, extra_keys: Mapping[str, tuple[Any, str]] | None = None) -> list[dict[str, Any]]:
    """Each signature over ``digest``: its key id, kind (OMS or legacy), and, where this
    machine knows the key (the trust policy's, or ``extra_keys``: ``--require-signature``),
    its label and whether it verified for ``name@version`` (``signed by release.pub (OMS,
    team/m@4): verified``); a signature by a key known nowhere here is "not checked"."""
    from ..format.signing import check_signatures

    policy = registry.trust_policy
    labels = policy.labels()
    known = {**{kid: (k, labels[kid]) for kid, k in policy.keys().items()}, **dict(extra_keys or {})}
    sigs = [dict(s) for s in signatures if isinstance(s, Mapping)]
    checks = {c.key_id: c for c in check_signatures(digest, sigs, {kid: k for kid, (k, _) in known.items()},
                                                    name=name, version=version)}
    out = []
    for s in sigs:
        kid = str(s.get("key_id"))
        kind = "OMS" if s.get("algorithm") == "oms-v1" else "legacy"
        c = checks.get(kid)
        label = known[kid][1] if kid in known else f"{kid[:19]}..."
        status = ("not checked (no key for it here)" if c is None else "verified" if c.valid
                  else f"INVALID: {c.problem}")
        names = f", {c.model}@{c.version}" if c is not None and c.bound else ""
        out.append({"key_id": kid, "algorithm": s.get("algorithm"), "kind": kind, "key": label if kid in known else None,
                    "checked": c is not None, "verified": bool(c and c.valid), "model": c.model if c else None,
                    "version": c.version if c else None, "signed_at": c.signed_at if c else None,
                    "problem": c.problem if c else None, "text": f"signed by {label} ({kind}{names}): {status}"})
    return out


def node_json(n: LineageNode) -> dict[str, Any]:
    return {"ref": n.ref, "name": n.name, "version": n.number, "digest": n.digest, "status": n.status,
            "depth": n.depth, "aliases": sorted(n.aliases or []),
            "created_by": n.created_by,
            "created_at": iso_utc(n.created_at),
            "environment": n.environment,
            "edges": [{"kind": e.kind, "value": e.value, "digest": e.digest, "extra": e.extra}
                      for e in n.edges]}


def event_json(e: AuditEvent) -> dict[str, Any]:
    return {"seq": e.seq, "time": iso_utc(e.ts),
            "actor": e.actor, "host": e.host, "action": e.action, "name": e.model, "version": e.version,
            "digest": e.digest, "ref": e.ref, "details": e.details, "hash": e.hash, "prev_hash": e.prev_hash}


def policy_json(p: AliasPolicy) -> dict[str, Any]:
    """An alias policy as ``policy show --json`` prints it (key ids, not the PEM texts)."""
    return {"name": p.name, "alias": p.alias, "role_scope": p.role_scope,
            "require_signature": list(p.key_ids), "require_attestation": list(p.attestations),
            "immutable": p.immutable, "rules": p.describe(),
            "updated_at": iso_utc(p.updated_at), "updated_by": p.updated_by}


def attestation_json(a: AttestationRecord) -> dict[str, Any]:
    """An attestation as ``attestations --json`` (and ``show --json``) print it."""
    return {"id": a.id, "ref": f"{a.name}@{a.number}", "digest": a.digest, "label": a.label,
            "passed": a.passed, "device": a.device, "target": a.target, "results": a.results,
            "error": a.error, "signed_by": a.key_id, "signature": a.signature,
            "created_at": iso_utc(a.created_at), "created_by": a.created_by}
