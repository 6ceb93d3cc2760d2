"""Issue 6: Ed25519 signing of versions; --require-signature refuses unsigned or forged ones."""

import os

import pytest

from registry.format.bundle import BundleFile


# signatures are checked by the client: the local store and the team tier (PostgreSQL + S3) cover
# both metadata and both blob back ends; SQLite + moto would only repeat them
@pytest.mark.slow
@pytest.mark.parametrize("reg_env", ["local", pytest.param("team", marks=pytest.mark.integration)],
                         indirect=True)
def test_signed_version_verifies_and_unsigned_is_refused(reg_env, bundles, tmp_path):
    assert reg_env.cli("key", "generate", str(tmp_path / "ci")).returncode == 0
    assert reg_env.cli("key", "generate", str(tmp_path / "other")).returncode == 0
    assert oct((tmp_path / "ci.key").stat().st_mode)[-3:] == "600"
    again = reg_env.cli("key", "generate", str(tmp_path / "ci"))
    assert again.returncode == 2 and "already exists" in again.stderr

    r = reg_env.cli("push", str(bundles["ed"]), "--name", "m", "--sign", str(tmp_path / "ci.key"), "--json")
    assert r.returncode == 0, r.stderr
    assert reg_env.cli("push", str(bundles["v4"]), "--name", "m").returncode == 0  # unsigned v2

    out = tmp_path / "signed.pt2b"
    r = reg_env.cli("pull", "m@1", "-o", str(out), "--require-signature", str(tmp_path / "ci.pub"))
    assert r.returncode == 0, r.stderr
    sigs = BundleFile.open(out).signatures
    assert len(sigs) == 1 and sigs[0]["algorithm"] == "oms-v1"  # a statement naming m@1
    # any one of several keys suffices
    r = reg_env.cli("pull", "m@1", "-o", str(out), "--require-signature", str(tmp_path / "other.pub"),
                    "--require-signature", str(tmp_path / "ci.pub"))
    assert r.returncode == 0, r.stderr

    for cmd in (["verify", "m@1"], ["run", "m@1", "--samples"], ["verify", str(out)]):
        r = reg_env.cli(*cmd, "--require-signature", str(tmp_path / "ci.pub"))
        assert r.returncode == 0, (cmd, r.stdout, r.stderr)
        r = reg_env.cli(*cmd, "--require-signature", str(tmp_path / "other.pub"))
        assert r.returncode == 5 and "not signed by any" in r.stderr, (cmd, r.stderr)
    digest = BundleFile.open(out).digest  # a cached, pinned ref keeps its signatures
    r = reg_env.cli("verify", f"m@{digest}", "--require-signature", str(tmp_path / "ci.pub"))
    assert r.returncode == 0, r.stderr
    r = reg_env.cli("verify", "m@2", "--require-signature", str(tmp_path / "ci.pub"))
    assert r.returncode == 5 and "not signed" in r.stderr
    for ref, key, needle in (("m@2", "ci.pub", "not signed"), ("m@1", "other.pub", "not signed by any")):
        bad = tmp_path / "bad.pt2b"
        r = reg_env.cli("pull", ref, "-o", str(bad), "--require-signature", str(tmp_path / key))
        assert r.returncode == 5, r.stderr
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert not bad.exists()


def test_python_api_signing(tmp_path, bundles):
    from registry.client import Registry
    from registry.config import Settings
    from registry.errors import SignatureError
    from registry.format.signing import generate_keypair
    from registry.runtime.loader import load

    key, pub = generate_keypair(tmp_path / "k")
    reg = Registry(Settings.resolve(home=str(tmp_path / "home")))
    reg.push(bundles["ed"], "api", sign_key=key, detect_git=False)
    src = reg.materialize("api@1")
    assert src.signatures and src.signatures[0]["algorithm"] == "oms-v1"
    model = load(bundles["ed"], require_signature=[], cache_dir=tmp_path / "c")
    assert "encoder" in model
    with pytest.raises(SignatureError):
        load(bundles["ed"], require_signature=[str(pub)], cache_dir=tmp_path / "c")


def test_forged_signature_in_bundle_is_refused(reg_env, bundles, tmp_path):
    """A bundle carrying a signature over another digest, or garbage, never passes."""
    from registry.format.bundle import write_bundle
    from registry.format.signing import generate_keypair, sign_digest

    key, pub = generate_keypair(tmp_path / "k")
    src = BundleFile.open(bundles["v5"])
    forged = sign_digest(key, "sha256:" + "1" * 64)
    forged["digest"] = src.digest  # claims to be for this bundle, but signs something else
    out = tmp_path / "forged.pt2b"
    sources = {m.path: (lambda p=m.path: src.open_member(p)) for m in src.manifest.members}
    write_bundle(out, src.manifest, sources, signatures=[forged])
    assert reg_env.cli("push", str(out), "--name", "f").returncode == 0
    r = reg_env.cli("pull", "f@1", "-o", str(tmp_path / "x.pt2b"), "--require-signature", str(pub))
    assert r.returncode == 5 and "invalid" in r.stderr, r.stderr


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_key_files_missing_or_huge(reg_env, bundles, tmp_path):
    reg_env.cli("push", str(bundles["v4"]), "--name", "k")
    r = reg_env.cli("pull", "k@1", "-o", str(tmp_path / "x.pt2b"), "--require-signature", str(tmp_path / "nope.pub"))
    assert r.returncode == 3 and "not found" in r.stderr, r.stderr
    huge = tmp_path / "huge.pub"
    with open(huge, "wb") as f:
        f.truncate(1 << 30)  # sparse: a reader that slurps it would allocate 1 GiB
    r = reg_env.cli("pull", "k@1", "-o", str(tmp_path / "x.pt2b"), "--require-signature", str(huge))
    assert r.returncode == 2 and "KiB" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_signature_for_another_bundle_is_refused_at_push(reg_env, bundles, tmp_path):
    from registry.format.bundle import write_bundle
    from registry.format.signing import generate_keypair, sign_digest

    key, _pub = generate_keypair(tmp_path / "k")
    src = BundleFile.open(bundles["v3"])
    other = sign_digest(key, BundleFile.open(bundles["v2"]).digest)
    out = tmp_path / "misfiled.pt2b"
    sources = {m.path: (lambda p=m.path: src.open_member(p)) for m in src.manifest.members}
    write_bundle(out, src.manifest, sources, signatures=[other])
    r = reg_env.cli("push", str(out), "--name", "m")
    assert r.returncode == 5 and "another bundle" in r.stderr, r.stderr
    assert reg_env.cli("show", "m@1").returncode == 3


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_a_signing_key_others_can_read_is_refused(reg_env, bundles, tmp_path):
    """As ssh refuses such a key: one line naming the mode and the fix, exit 2, nothing pushed."""
    from registry.format.signing import generate_keypair

    key, _pub = generate_keypair(tmp_path / "k")
    os.chmod(key, 0o644)
    r = reg_env.cli("push", str(bundles["v5"]), "--name", "loose", "--sign", str(key))
    assert r.returncode == 2 and "accessible by group or others (mode 0644)" in r.stderr, r.stderr
    assert f"chmod 600 {key}" in r.stderr and len(r.stderr.strip().splitlines()) <= 2, r.stderr
    assert reg_env.cli("show", "loose").returncode == 3  # nothing was published
    os.chmod(key, 0o600)
    assert reg_env.cli("push", str(bundles["v5"]), "--name", "loose", "--sign", str(key)).returncode == 0
