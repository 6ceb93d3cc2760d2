"""Issue 3: publish, pull and lifecycle through the CLI contract, on every backend setup."""
import json

import pytest

from registry.format.bundle import BundleFile


def _json(r):
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.slow
def test_publish_pull_lifecycle(reg_env, bundles, tmp_path):
    ed = bundles["ed"]
    digest = BundleFile.open(ed).digest
    r = reg_env.cli("push", str(ed), "--name", "team/translator", "--alias", "staging")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"team/translator@1 {digest}"

    again = _json(reg_env.cli("push", str(ed), "--name", "team/translator", "--json"))
    assert (again["version"], again["created"], again["digest"]) == (1, False, digest)
    assert again["uploaded_bytes"] == 0 and "already" in again["warnings"][0]

    second = _json(reg_env.cli("push", str(bundles["v0"]), "--name", "team/translator", "--json"))
    assert second["version"] == 2 and second["created"]

    assert reg_env.cli("alias", "set", "team/translator", "prod", "1").returncode == 0
    for ref, number in (("team/translator@1", 1), ("team/translator@prod", 1), ("team/translator@staging", 1),
                        (f"team/translator@{digest}", 1), ("team/translator", 2)):
        out = tmp_path / f"pulled-{number}-{ref.split('@')[-1][:8]}.pt2b"
        pulled = _json(reg_env.cli("pull", ref, "-o", str(out), "--json"))
        assert pulled["version"] == number
        b = BundleFile.open(out)
        b.verify()
        if number == 1:
            assert out.read_bytes() == ed.read_bytes()  # byte-identical round trip

    shown = _json(reg_env.cli("show", "team/translator@prod", "--json"))
    assert shown["digest"] == digest and sorted(shown["aliases"]) == ["prod", "staging"]
    assert shown["metadata"] == {"owner": "nlp"}

    r = reg_env.cli("yank", "team/translator@2", "--reason", "regression in BLEU")
    assert r.returncode == 0, r.stderr
    latest = _json(reg_env.cli("show", "team/translator", "--json"))
    assert latest["version"] == 1  # latest skips yanked versions
    r = reg_env.cli("pull", "team/translator@2", "-o", str(tmp_path / "y.pt2b"))
    assert r.returncode == 0 and "yanked" in r.stderr and "regression in BLEU" in r.stderr

    listing = _json(reg_env.cli("list", "team/translator", "--json"))
    assert [(v["version"], v["status"]) for v in listing["versions"]] == [(1, "active"), (2, "yanked")]
    models = _json(reg_env.cli("list", "--json"))["models"]
    assert models[0]["name"] == "team/translator" and models[0]["aliases"] == {"prod": 1, "staging": 1}

    r = reg_env.cli("alias", "rm", "team/translator", "staging")
    assert r.returncode == 0, r.stderr
    assert reg_env.cli("show", "team/translator@staging").returncode == 3


def test_not_found_exits_3(reg_env, bundles, tmp_path):
    assert reg_env.cli("push", str(bundles["v1"]), "--name", "m").returncode == 0
    out = tmp_path / "x.pt2b"
    for ref, needle in (("nope", "not found"), ("m@7", "no version 7"), ("m@prod", "prod"),
                        ("m@sha256:" + "0" * 64, "sha256:000")):
        r = reg_env.cli("pull", ref, "-o", str(out))
        assert r.returncode == 3, (ref, r.stderr)
        assert needle in r.stderr and len(r.stderr.strip().splitlines()) == 1
        assert not out.exists()


def test_corrupt_blob_detected_on_pull(reg_env, bundles, tmp_path):
    pushed = json.loads(reg_env.cli("push", str(bundles["ed"]), "--name", "m", "--json").stdout)
    program = BundleFile.open(bundles["ed"]).member("programs/encoder.pt2")
    reg_env.corrupt_blob(program.digest)
    out = tmp_path / "x.pt2b"
    r = reg_env.cli("pull", f"m@{pushed['version']}", "-o", str(out), home=tmp_path / "fresh-home")
    assert r.returncode == 5, r.stderr
    assert program.digest[7:19] in r.stderr and "corrupt" in r.stderr
    assert not out.exists()
    cached = list((tmp_path / "fresh-home").rglob("*"))
    assert not [p for p in cached if p.is_file() and program.digest[7:] in p.name]  # never cached


def test_gc_reclaims_unreferenced_blobs(reg_env, bundles):
    assert reg_env.cli("push", str(bundles["v2"]), "--name", "m").returncode == 0
    orphan = reg_env.put_orphan(b"left behind by an interrupted push")
    dry = _json(reg_env.cli("gc", "--dry-run", "--json"))
    assert [d["digest"] for d in dry["deleted"]] == [orphan] and reg_env.blob_exists(orphan)
    done = _json(reg_env.cli("gc", "--json"))
    assert [d["digest"] for d in done["deleted"]] == [orphan] and not reg_env.blob_exists(orphan)
    assert reg_env.cli("pull", "m", "-o", str(reg_env.home / "ok.pt2b"), home=reg_env.home / "h2").returncode == 0


@pytest.mark.parametrize("reg_env", ["local", pytest.param("team", marks=pytest.mark.integration)],
                         indirect=True)
def test_six_concurrent_publishers_get_six_versions(reg_env, bundles):
    from concurrent.futures import ThreadPoolExecutor

    if reg_env.kind == "local":  # create the embedded database once, like a first user would
        assert reg_env.cli("list").returncode == 0

    def publish(bundle):   # six real processes at once
        return reg_env.cli_process("push", bundle, "--name", "race/model", "--json")

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(publish, [bundles[f"v{i}"] for i in range(6)]))
    for r in results:
        assert r.returncode == 0 and r.stderr.strip() == "", r.stderr
    numbers = sorted(json.loads(r.stdout)["version"] for r in results)
    assert numbers == [1, 2, 3, 4, 5, 6]
    assert reg_env.cli("audit", "--verify").returncode == 0
