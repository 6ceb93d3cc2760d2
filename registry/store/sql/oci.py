"""``OciArtifacts`` over SQL: the pushes of versions to OCI registries."""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from ...refs import (
    validate_digest,
    validate_name,
)
from .. import audit_log
from ..audit_chain import parse_ts
from ..orm import (
    ModelRow,
    OciArtifactRow,
    VersionRow,
    now_text,
)
from ..records import (
    OciArtifactRecord,
)
from ._base import SqlStoreBase, _audit_details

__all__ = ["SqlOciArtifacts"]


class SqlOciArtifacts(SqlStoreBase):
    """Where versions were pushed as OCI artifacts."""

    def record_oci_artifact(self, name: str, number: int, *, location: str, tag: str | None, manifest_digest: str,
                            actor: str, host: str, audit_details: Mapping[str, Any] | None = None) -> OciArtifactRecord:
        """Record that ``name@number`` was pushed to the OCI repository ``location`` (``HOST/REPO``)
        as ``manifest_digest`` (under ``tag``), audited as ``oci.push``; a push recorded already
        is returned as it was."""
        validate_digest(manifest_digest)
        extra = _audit_details(audit_details)

        def work(s: Session) -> OciArtifactRecord:
            version = self._version(s, self._model(s, validate_name(name)), number)
            row = s.scalars(select(OciArtifactRow).where(
                OciArtifactRow.version_id == version.id, OciArtifactRow.location == location,
                OciArtifactRow.manifest_digest == manifest_digest,
                OciArtifactRow.tag.is_(None) if tag is None else OciArtifactRow.tag == tag)).first()
            if row is None:
                row = OciArtifactRow(version_id=version.id, location=location, tag=tag,
                                     manifest_digest=manifest_digest, pushed_at=now_text(s), pushed_by=actor)
                s.add(row)
                s.flush()
                audit_log.append_event(s, "oci.push", actor=actor, host=host, model=name, number=number,
                                       digest=version.digest, details={"location": location, "tag": tag,
                                                                       "manifest_digest": manifest_digest},
                                       extra=extra)
            return _oci_record(row)

        return self._write(work)

    def oci_artifacts(self, name: str, number: int) -> list[OciArtifactRecord]:
        """Where ``name@number`` was pushed as an OCI artifact, oldest first."""
        def work(s: Session) -> list[OciArtifactRecord]:
            version = self._version(s, self._model(s, name), number)
            return [_oci_record(r) for r in s.scalars(select(OciArtifactRow).where(
                OciArtifactRow.version_id == version.id).order_by(OciArtifactRow.id))]

        return self._read(work)

    def oci_repositories(self, host: str) -> list[str]:
        """The repositories of OCI registry ``host`` versions were pushed to, newest push first
        (where a push may mount blobs from)."""
        return list(dict.fromkeys(repo for repo, _model in self.oci_locations(host)))

    def oci_locations(self, host: str) -> list[tuple[str, str]]:
        """(repository, model name) of the pushes to OCI registry ``host``, newest first, at
        most 64 (the server answers ``oci_repositories`` with those of models a caller may pull)."""
        prefix = host.lower() + "/"

        def work(s: Session) -> list[tuple[str, str]]:
            newest = func.max(OciArtifactRow.id)
            rows = s.execute(select(OciArtifactRow.location, ModelRow.name, newest)
                             .join(VersionRow, VersionRow.id == OciArtifactRow.version_id)
                             .join(ModelRow, ModelRow.id == VersionRow.model_id)
                             .where(OciArtifactRow.location.startswith(prefix, autoescape=True))
                             .group_by(OciArtifactRow.location, ModelRow.name).order_by(newest.desc())
                             .limit(64)).all()
            return [(loc[len(prefix):], name) for loc, name, _ in rows]

        return self._read(work)

def _oci_record(row: OciArtifactRow) -> OciArtifactRecord:
    return OciArtifactRecord(location=row.location, tag=row.tag, manifest_digest=row.manifest_digest,
                             pushed_at=parse_ts(row.pushed_at), pushed_by=row.pushed_by)
