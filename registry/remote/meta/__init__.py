"""``HttpMetadataStore``: the ``MetadataStore`` protocol (``registry.client.ports``) over a
registry server's ``/v1`` routes, one class per port (as ``registry.store.sql``), composed.

Records travel as ``registry.remote.wire`` JSON, so every method returns the same frozen
records ``SqlMetadataStore`` does, and every error is the ``RegistryError`` the server raised
(``registry.remote.http``). Who acts is the server's business: it records the token's owner,
so the ``actor`` arguments here are not sent (the claimed ``host`` is, as a detail).

What only the server may do is declared, not probed: ``extends_claims`` is False (a push hashes
its packs first), ``gc`` asks the server to collect (an admin token), ``locate_chunks`` answers
None from a server older than packs and ``recorded_blobs`` always None.

    >>> meta = HttpMetadataStore(HttpClient("http://127.0.0.1:8710", token))   # doctest: +SKIP
    >>> meta.resolve(Ref.parse("team/bert@prod")).number                       # doctest: +SKIP
    3
"""
from __future__ import annotations

from ._base import HttpStoreBase
from .access import HttpAccessStore
from .audit import HttpAuditLog
from .governance import HttpGovernanceStore
from .oci import HttpOciArtifacts
from .pushes import LOCATE_BATCH, SERVER_SIDE_HINT, HttpPushStore
from .versions import HttpVersionStore
from .webhooks import HttpWebhookStore

__all__ = ["HttpMetadataStore", "SERVER_SIDE_HINT", "LOCATE_BATCH", "HttpStoreBase", "HttpVersionStore",
           "HttpPushStore", "HttpAuditLog", "HttpAccessStore", "HttpGovernanceStore", "HttpWebhookStore",
           "HttpOciArtifacts"]


class HttpMetadataStore(HttpVersionStore, HttpPushStore, HttpAuditLog, HttpAccessStore, HttpGovernanceStore,
                        HttpWebhookStore, HttpOciArtifacts):
    """A registry server's metadata, through ``client`` (shared with ``HttpBlobStore``): every
    port of ``registry.client.ports.MetadataStore``."""
