"""A pull writes every byte once, into the bundle file (issue 45: a 2 GiB pull used to write and
hash it twice, into the cache and then into the bundle). The cache records where each member
lies verified in that file, so the pinned ref is served from there (``run``, ``verify``,
``registry.load``, a pull again) with no database and no store, as ARCHITECTURE's cache contract
says, for as long as the file is unchanged; once it changed (a byte, a ``chmod``, replaced, a
reboot) it is not trusted and the member is fetched again, or the command fails with one line.
"""
import dataclasses
import hashlib
import os

import pytest

from registry.client.sources import BlobCache
from registry.format.bundle import BundleFile, FileRange

#: a registry nobody can reach: a pin served from it was served without database and store
_GONE = {"db": "sqlite:////nonexistent/pt2reg-gone/registry.db", "store": "file:///nonexistent/pt2reg-gone"}


def _unreachable(reg_env):
    return dataclasses.replace(reg_env, url="http://127.0.0.1:9" if reg_env.url else None, **_GONE)


def _flip(path):
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(os.fstat(f.fileno()).st_size // 2)
        b = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([b[0] ^ 0x20]))


def _pushed(reg_env, path, name):
    """``path`` pushed as ``name``: its bundle and the digest pin of the version."""
    src = BundleFile.open(path)
    assert reg_env.cli("push", str(path), "--name", name).returncode == 0
    return src, f"{name}@{src.digest}"


def _drop_cached(cache, bundle):
    for m in bundle.manifest.members:
        cache.member_path(m).unlink(missing_ok=True)


@pytest.mark.parametrize("reg_env", ["local", "moto", "server"], indirect=True)
def test_a_pull_writes_each_byte_once_and_its_file_serves_the_pin(reg_env, bundles, tmp_path):
    good = bundles["ed"]
    src, pin = _pushed(reg_env, good, "ed")
    out = tmp_path / "out.pt2b"
    r = reg_env.cli("pull", pin, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == good.read_bytes()
    cache = BlobCache(reg_env.home / "cache")
    assert [cache.member_path(m).exists() for m in src.manifest.members] == [False] * len(src.manifest.members)
    assert [cache.member_in_bundle(m) for m in src.manifest.members] == \
        [FileRange(out, *src.member_span(m.path)) for m in src.manifest.members]

    gone = _unreachable(reg_env)
    r = gone.cli("run", pin, "--samples", "--json")   # from the file the pull wrote: no database, no store
    assert r.returncode == 0, r.stderr
    program = src.manifest.member("programs/decoder.pt2")
    assert hashlib.sha256(cache.member_path(program).read_bytes()).hexdigest() == program.sha256

    # pulled again over the same path: copied from the file itself, and the new file serves next
    _drop_cached(cache, src)
    r = reg_env.cli("pull", pin, "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert out.read_bytes() == good.read_bytes()
    assert cache.member_in_bundle(program) is not None
    assert gone.cli("verify", pin).returncode == 0


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_a_changed_pulled_file_is_not_trusted(reg_env, bundles, tmp_path):
    src, pin = _pushed(reg_env, bundles["v3"], "m")
    cache = BlobCache(reg_env.home / "cache")
    gone = _unreachable(reg_env)

    def pull(name: str):
        out = tmp_path / name
        r = reg_env.cli("pull", pin, "-o", str(out))
        assert r.returncode == 0, r.stderr
        assert all(cache.member_in_bundle(m) is not None for m in src.manifest.members)
        return out

    out = pull("a.pt2b")
    os.chmod(out, 0o600)   # its ctime moved: no longer what was verified
    assert [cache.member_in_bundle(m) for m in src.manifest.members] == [None] * len(src.manifest.members)
    r = gone.cli("run", pin, "--samples")
    assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
    assert reg_env.cli("run", pin, "--samples").returncode == 0   # fetched again from the store

    _drop_cached(cache, src)
    out = pull("b.pt2b")
    _flip(out)   # a byte changed in place, the file still the size it was
    r = gone.cli("run", pin, "--samples")
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert not any(cache.member_path(m).exists() for m in src.manifest.members)   # nothing taken from it

    out = pull("c.pt2b")
    replacement = tmp_path / "other.pt2b"
    replacement.write_bytes(out.read_bytes())
    os.replace(replacement, out)   # the same bytes, another file: not the one verified
    assert all(cache.member_in_bundle(m) is None for m in src.manifest.members)

    pull("d.pt2b")
    import registry.client.sources as sources  # a stamp names this boot: after a reboot it is void

    real = sources._BOOT_ID
    try:
        sources._BOOT_ID = "another-boot"
        assert all(cache.member_in_bundle(m) is None for m in src.manifest.members)
    finally:
        sources._BOOT_ID = real
    assert all(cache.member_in_bundle(m) is not None for m in src.manifest.members)


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_a_damaged_store_fails_the_pull_leaving_nothing(reg_env, bundles, tmp_path):
    src, _ = _pushed(reg_env, bundles["v4"], "m")
    for m in src.manifest.members:
        for digest in ([f"sha256:{c}" for c, _ in m.chunks] or [m.digest]):
            reg_env.corrupt_blob(digest)
    out = tmp_path / "out.pt2b"
    r = reg_env.cli("pull", "m@1", "-o", str(out))
    assert r.returncode == 5 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert not out.exists() and [p.name for p in tmp_path.iterdir() if p.name.startswith("out")] == []
    cache = BlobCache(reg_env.home / "cache")
    assert all(cache.member_in_bundle(m) is None for m in src.manifest.members)
