"""The client cache is trusted only as far as it is unchanged since it was verified.

A cached blob whose file changed (a byte flipped in place, truncated) is re-hashed before use,
evicted and fetched again from the store; it is never loaded. When the store is damaged too,
the command fails with exit 5 and one line.
"""
import hashlib
import json
import os

import pytest

from registry.format.bundle import BundleFile


def _cache_file(reg_env, digest):
    h = digest.split(":", 1)[1]
    return reg_env.home / "cache" / "blobs" / "sha256" / h[:2] / h


def _flip(path, where=None):
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        size = os.fstat(f.fileno()).st_size
        f.seek(size // 2 if where is None else where)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x40]))
    os.chmod(path, 0o444)


@pytest.mark.slow
@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_damaged_cache_entries_are_fetched_again_never_loaded(reg_env, bundles, tmp_path):
    good = bundles["ed"]
    src = BundleFile.open(good)
    assert reg_env.cli("push", str(good), "--name", "ed").returncode == 0
    pin = f"ed@{src.digest}"
    assert reg_env.cli("run", pin, "--samples").returncode == 0  # fills the cache
    program = next(m for m in src.manifest.members if m.path == "programs/decoder.pt2")
    cached = _cache_file(reg_env, program.digest)
    assert cached.is_file()

    _flip(cached)  # a byte changed in place: a warm run must notice before loading it
    r = reg_env.cli("run", pin, "--samples", "--json")
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == program.sha256  # fetched again

    os.chmod(cached, 0o644)
    os.truncate(cached, program.size // 3)
    out = tmp_path / "out.pt2b"
    r = reg_env.cli("pull", "ed@1", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == good.read_bytes()
    # pull -o writes every byte once, into the bundle: the damaged entry was dropped, not used,
    # and not written again; a run copies the member in from the bundle the pull verified
    assert not _cache_file(reg_env, program.digest).exists()
    assert reg_env.cli("run", pin, "--samples").returncode == 0
    assert hashlib.sha256(cached.read_bytes()).hexdigest() == program.sha256

    # the store is damaged as well, and the pulled bundle changed: nothing good to fetch, so
    # exit 5, one line, no output
    _flip(out, where=out.stat().st_size // 2)
    for m in src.manifest.members:
        if m.path == program.path:
            for digest in ([f"sha256:{c}" for c, _ in m.chunks] or [m.digest]):
                reg_env.corrupt_blob(digest)
    _flip(cached)
    out2 = tmp_path / "out2.pt2b"
    for args in (["run", pin, "--samples"], ["pull", "ed@1", "-o", str(out2)]):
        r = reg_env.cli(*args)
        assert r.returncode == 5, (args, r.stderr)
        assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert not out2.exists()
    assert not _cache_file(reg_env, program.digest).exists()  # the bad entry was evicted


def test_damaged_cache_under_a_bundle_file_is_rewritten_from_the_file(bundles, tmp_path):
    from registry.client.sources import BlobCache
    from registry.runtime.loader import load

    good = bundles["v2"]
    src = BundleFile.open(good)
    cache = tmp_path / "cache"
    load(good, cache_dir=cache)
    m = src.manifest.members[0]
    path = BlobCache(cache).path(m.digest)
    _flip(path, where=100)
    bundle = load(good, cache_dir=cache)
    assert "decoder" in bundle
    assert hashlib.sha256(path.read_bytes()).hexdigest() == m.sha256
    assert json.dumps(sorted(p.name for p in (cache / "blobs" / "sha256").rglob("*") if ".incomplete" in p.name)) == "[]"


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_a_cached_digest_is_served_only_under_a_model_name_it_was_published_as(reg_env, bundles):
    """A pinned ref is answered from the cache with no database round trip, but only under a
    name the database resolved it under: another model's digest is still 'not found' (exit 3)."""
    assert reg_env.cli("push", str(bundles["v0"]), "--name", "a").returncode == 0
    assert reg_env.cli("push", str(bundles["v1"]), "--name", "b").returncode == 0
    digest = BundleFile.open(bundles["v0"]).digest
    r = reg_env.cli("verify", f"a@{digest}")  # resolved by the database, now cached
    assert r.returncode == 0, r.stderr
    r = reg_env.cli("verify", f"b@{digest}")
    assert r.returncode == 3 and "b" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    # the same digest under its own name is served from the cache even with the database gone
    os.rename(reg_env.db[len("sqlite:///"):], reg_env.db[len("sqlite:///"):] + ".away")
    r = reg_env.cli("verify", f"a@{digest}")
    assert r.returncode == 0, r.stderr
