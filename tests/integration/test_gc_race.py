"""gc vs a push that claims an orphan blob: the sweep re-reads claims under the lock that
begin_pending takes, so the blob survives (or is gone before the push looks for it)."""
import hashlib
import os

from registry.client import Registry
from registry.client.gc import _claim_alive
from registry.config import Settings, hostname


def test_claim_made_after_gc_listed_candidates_still_protects_the_blob(tmp_path):
    reg = Registry(Settings.resolve(home=str(tmp_path / "home")))
    data = b"an orphan from an interrupted push"
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    reg.blobs.put_bytes(data, digest)
    candidates = [(digest, len(data))]  # what gc decided before the push below started

    claim = reg.meta.begin_pending([digest], host=hostname(), pid=os.getpid())  # a live push
    deleted = reg.meta.sweep_blobs(candidates, is_alive=_claim_alive, delete=reg.blobs.delete,
                                   actor="gc", host=hostname())
    assert deleted == [] and reg.blobs.exists(digest)

    reg.meta.end_pending(claim)
    deleted = reg.meta.sweep_blobs(candidates, is_alive=_claim_alive, delete=reg.blobs.delete,
                                   actor="gc", host=hostname())
    assert deleted == candidates and not reg.blobs.exists(digest)
    events = [e for e in reg.meta.events() if e.action == "gc.delete"]
    assert [e.digest for e in events] == [digest]
    assert reg.meta.verify_audit_chain().ok
