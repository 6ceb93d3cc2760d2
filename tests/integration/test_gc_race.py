"""gc vs a push that claims an orphan blob: the sweep re-reads claims under the lock that
begin_pending takes, so the blob survives (or is gone before the push looks for it)."""
import hashlib
import os

import pytest

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


def _held_files(store_dir) -> list[str]:
    tmp = store_dir / "tmp"
    return [f.name for d in (tmp.iterdir() if tmp.exists() else ()) if d.is_dir() for f in d.iterdir()]


def test_gc_while_a_push_copies_before_its_claim_spares_the_copies(tmp_path, bundles):
    """A local push copies its large blobs while the metadata store opens, before it claims
    them: a gc then (no grace) finds those copies in a locked ``tmp/held-*`` directory and
    leaves them alone; the version the push records is whole and pulls."""
    from registry.format.bundle import BundleFile
    from tests.until import wait_until

    reg = Registry(Settings.resolve(home=str(tmp_path / "home")))
    meta, store_dir = reg.meta, reg.settings.home / "store"
    seen = {}

    def open_meta():
        seen["held"] = wait_until(lambda: _held_files(store_dir), "the push's first copy before its claim")
        seen["gc"] = reg.gc()
        return meta

    from registry.client.push import push_bundle

    result = push_bundle(open_meta, reg.blobs, BundleFile.open(bundles["v0"]), "m")
    assert seen["held"] and seen["gc"].aborted_uploads == [] and seen["gc"].deleted == []
    assert result.created and _held_files(store_dir) == []
    reg.pull("m@1", tmp_path / "out.pt2b")
    assert (tmp_path / "out.pt2b").read_bytes() == bundles["v0"].read_bytes()


def test_a_push_whose_database_does_not_open_leaves_nothing_in_the_store(tmp_path, bundles):
    """The copies made before the claim are discarded when the claim never comes (here the
    metadata store fails to open): no blob, no temp file."""
    from registry.client.push import push_bundle
    from registry.errors import StoreError
    from registry.format.bundle import BundleFile

    reg = Registry(Settings.resolve(home=str(tmp_path / "home")))

    def open_meta():
        raise StoreError("cannot open the database")

    with pytest.raises(StoreError, match="cannot open"):
        push_bundle(open_meta, reg.blobs, BundleFile.open(bundles["v0"]), "m")
    assert list(reg.blobs.list()) == []
    tmp = reg.settings.home / "store" / "tmp"
    assert not tmp.exists() or list(tmp.iterdir()) == []
