"""OCI delivery (issue 43) against a real OCI registry (the CNCF distribution server, started by
``tests.services_oci``) and an independent OCI client (``skopeo``).

The programs: a ~1.6 MiB MLP of six 256x256 layers (each weight its own chunk, each bias in a
pack) and its fine-tune, the same but for one layer: what a fine-tune pushes is that layer, the
pack of the small tensors that changed, the bundle layer and the config; the rest is found in
the repository (HEAD) or, in another repository, mounted.
"""
from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest

from tests.cli_inprocess import refused
from tests.shared import built_once

pytestmark = pytest.mark.integration


def _build_programs(out: Path) -> None:
    import torch

    torch.manual_seed(0)

    class MLP(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layers = torch.nn.ModuleList(torch.nn.Linear(256, 256) for _ in range(6))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = torch.relu(layer(x))
            return x

    base = MLP().eval()
    x = torch.randn(3, 256)
    torch.export.save(torch.export.export(base, (x,)), out / "base.pt2")
    with torch.no_grad():
        base.layers[2].weight.add_(0.01)
        base.layers[2].bias.add_(0.01)
    torch.export.save(torch.export.export(base, (x,)), out / "tuned.pt2")
    torch.save((x,), out / "x.pt")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_once(tmp_path_factory, "oci-programs", _build_programs)


@pytest.fixture
def published(pt2reg, programs: Path, tmp_path: Path) -> dict[str, str]:
    """team/m@1 (base, signed, attested) and team/m@2 (the fine-tune) in a fresh local registry."""
    for name in ("base", "tuned"):
        r = pt2reg("bundle", programs / f"{name}.pt2", "--sample", f"model={programs / 'x.pt'}",
                   "-o", tmp_path / f"{name}.pt2b")
        assert r.exit_code == 0, r.output
        r = pt2reg("push", tmp_path / f"{name}.pt2b", "--name", "team/m")
        assert r.exit_code == 0, r.output
    assert pt2reg("key", "generate", tmp_path / "rel", "--type", "ed25519").exit_code == 0
    assert pt2reg("sign", "team/m@1", "--key", tmp_path / "rel.key").exit_code == 0
    r = pt2reg("attest", "team/m@1", "--label", "cpu-ci", "--device", "cpu", "--sign", tmp_path / "rel.key")
    assert r.exit_code == 0, r.output
    return {"key": str(tmp_path / "rel.key"), "pub": str(tmp_path / "rel.pub")}


def _repo(request: pytest.FixtureRequest, oci_registry, suffix: str = "") -> str:
    name = "t/" + "".join(c if c.isalnum() else "-" for c in request.node.name.lower()).strip("-")[:60] + suffix
    return f"{oci_registry.host}/{name}"


def _manifest(reference: str) -> dict:
    """The OCI manifest as skopeo reads it."""
    return json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{reference}"],
                                     check=True, capture_output=True).stdout)


def _push(pt2reg, ref: str, target: str, *extra: str) -> dict:
    r = pt2reg("oci", "push", ref, target, "--json", *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_push_then_pull_by_digest_rebuilds_the_same_bundle(pt2reg, published, oci_registry, request, tmp_path):
    repo = _repo(request, oci_registry)
    pushed = _push(pt2reg, "team/m@1", f"{repo}:v1")
    pinned = f"{repo}@{pushed['manifest_digest']}"
    assert pushed["reference"] == f"{repo}:v1@{pushed['manifest_digest']}"
    assert len(pushed["referrers"]) == 2       # the signature and the attestation

    r = pt2reg("oci", "pull", pinned, "-o", tmp_path / "from-oci.pt2b")
    assert r.exit_code == 0, r.output
    assert pt2reg("pull", "team/m@1", "-o", tmp_path / "direct.pt2b").exit_code == 0
    assert (tmp_path / "from-oci.pt2b").read_bytes() == (tmp_path / "direct.pt2b").read_bytes()

    shown = json.loads(pt2reg("show", "team/m@1", "--json").stdout)
    assert [a["reference"] for a in shown["oci"]] == [pinned]
    assert shown["oci"][0]["tag"] == "v1"
    # pushing again sends nothing new and records nothing new
    again = _push(pt2reg, "team/m@1", f"{repo}:v1")
    assert again["manifest_digest"] == pushed["manifest_digest"] and again["uploaded"] == 0
    assert len(json.loads(pt2reg("show", "team/m@1", "--json").stdout)["oci"]) == 1


def test_a_fine_tune_uploads_only_what_changed_and_other_repositories_mount(pt2reg, published, oci_registry,
                                                                             request):
    repo = _repo(request, oci_registry)
    first = _push(pt2reg, "team/m@1", f"{repo}:v1")
    assert first["uploaded"] == first["layers"] + 1 and first["present"] == 0   # every layer and the config
    second = _push(pt2reg, "team/m@2", f"{repo}:v2")
    layers = {tag: {x["digest"] for x in _manifest(f"{repo}:{tag}")["layers"]} for tag in ("v1", "v2")}
    new = layers["v2"] - layers["v1"]
    # the changed weight (its own chunk), the pack of the changed bias, the golden sample (its
    # outputs changed) and the bundle layer; the other five weights were not sent again
    assert len(new) == 4 and len(layers["v2"] & layers["v1"]) == len(layers["v2"]) - 4
    assert second["uploaded"] == len(new) + 1, second   # and the config
    assert second["present"] == second["layers"] - len(new)
    # the same version to another repository of the registry: its blobs are mounted, not uploaded
    other = _push(pt2reg, "team/m@2", _repo(request, oci_registry, "-copy") + ":v2")
    assert other["uploaded"] == 0 and other["mounted"] == other["layers"] + 1, other
    assert other["manifest_digest"] == second["manifest_digest"]


def test_a_tampered_layer_is_refused_and_nothing_is_written(pt2reg, published, request, tmp_path):
    """A registry that serves altered content: its own server (blobs are stored once per
    registry, by digest: damaging one in the run's shared registry would alter what other tests
    pull)."""
    from tests.cli_inprocess import invoker
    from tests.services_oci import oci_registry_server

    with oci_registry_server() as own:
        repo = f"{own.host}/t/tamper"
        pushed = _push(pt2reg, "team/m@1", f"{repo}:v1")
        manifest = _manifest(f"{repo}@{pushed['manifest_digest']}")
        weight = max((layer for layer in manifest["layers"] if layer["annotations"]["dev.pt2reg.layer"] == "blob"),
                     key=lambda layer: layer["size"])
        path = own.blob_path(weight["digest"])
        damaged = bytearray(path.read_bytes())
        damaged[len(damaged) // 2] ^= 0xFF
        path.write_bytes(bytes(damaged))
        out = tmp_path / "out.pt2b"
        r = invoker(tmp_path / "consumer")("oci", "pull", f"{repo}@{pushed['manifest_digest']}", "-o", out)
        refused(r, weight["digest"][:19], code=5)
        assert not out.exists()
        assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.pt2b")]
        r = invoker(tmp_path / "consumer2")("materialize", f"oci://{repo}@{pushed['manifest_digest']}",
                                            tmp_path / "mat", "--layout", "files")
        refused(r, code=5)
        assert not (tmp_path / "mat").exists()


def test_a_tag_needs_allow_tag(pt2reg, published, oci_registry, request, tmp_path):
    repo = _repo(request, oci_registry)
    _push(pt2reg, "team/m@1", f"{repo}:v1")
    r = pt2reg("oci", "pull", f"{repo}:v1", "-o", tmp_path / "a.pt2b")
    refused(r, "tag", "--allow-tag", code=2)
    assert not (tmp_path / "a.pt2b").exists()
    r = pt2reg("materialize", f"oci://{repo}:v1", tmp_path / "mat")
    refused(r, "tag", code=2)
    r = pt2reg("oci", "pull", f"{repo}:v1", "-o", tmp_path / "a.pt2b", "--allow-tag")
    assert r.exit_code == 0, r.output


def _policy(tmp_path: Path, rule: str, pub: str) -> Path:
    path = tmp_path / "trust.toml"
    path.write_text(f'[[rule]]\n{rule}\nkeys = ["{pub}"]\n')
    return path


def test_the_trust_policy_holds_for_oci_artifacts(pt2reg, published, oci_registry, request, tmp_path):
    repo = _repo(request, oci_registry)
    signed = _push(pt2reg, "team/m@1", f"{repo}:v1")
    unsigned = _push(pt2reg, "team/m@2", f"{repo}:v2")
    from tests.cli_inprocess import invoker

    consumer = invoker(tmp_path / "consumer")
    (tmp_path / "consumer").mkdir()
    _policy(tmp_path / "consumer", 'models = "team/*"', published["pub"])
    r = consumer("oci", "pull", f"{repo}@{unsigned['manifest_digest']}", "-o", tmp_path / "u.pt2b")
    refused(r, "team/m", "must be signed", code=5)
    assert not (tmp_path / "u.pt2b").exists()
    r = consumer("oci", "pull", f"{repo}@{signed['manifest_digest']}", "-o", tmp_path / "s.pt2b", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["trusted_signers"]

    # an artifact that claims another model name is still covered by a rule on where it came from
    assert pt2reg("push", tmp_path / "tuned.pt2b", "--name", "evil/x").exit_code == 0
    renamed = _push(pt2reg, "evil/x@1", f"{repo}:x")
    (tmp_path / "consumer" / "trust.toml").write_text(
        f'[[rule]]\noci = "{oci_registry.host}/t/**"\nkeys = ["{published["pub"]}"]\n')
    r = consumer("oci", "pull", f"{repo}@{renamed['manifest_digest']}", "-o", tmp_path / "x.pt2b")
    refused(r, "evil/x", "must be signed", code=5)
    r = consumer("materialize", f"oci://{repo}@{renamed['manifest_digest']}", tmp_path / "mat")
    refused(r, "must be signed", code=5)
    assert not (tmp_path / "mat").exists()


def test_referrers_carry_the_signature_and_the_attestation(pt2reg, published, oci_registry, request, tmp_path):
    repo = _repo(request, oci_registry)
    pushed = _push(pt2reg, "team/m@1", f"{repo}:v1")
    pinned = f"{repo}@{pushed['manifest_digest']}"
    r = pt2reg("oci", "referrers", pinned, "--key", published["pub"], "--json")
    assert r.exit_code == 0, r.output
    found = {x["kind"]: x for x in json.loads(r.stdout)["referrers"]}
    assert found["signature"]["verified"] is True and "team/m@1" in found["signature"]["detail"]
    assert found["attestation"]["verified"] is True and "cpu-ci: passed" in found["attestation"]["detail"]
    # without the key nothing is claimed verified
    r = pt2reg("oci", "referrers", pinned, "--json")
    assert {x["verified"] for x in json.loads(r.stdout)["referrers"]} == {None}
    # a consumer with only the OCI registry enforces the policy from the referrers alone
    from tests.cli_inprocess import invoker

    (tmp_path / "c").mkdir()
    _policy(tmp_path / "c", 'models = "team/*"', published["pub"])
    r = invoker(tmp_path / "c")("oci", "pull", pinned, "-o", tmp_path / "c.pt2b", "--json")
    assert r.exit_code == 0, r.output


def test_a_forged_referrer_does_not_verify(pt2reg, published, oci_registry, request, tmp_path):
    """A signature referrer whose bytes were replaced (same key id): listed as invalid, exit 5,
    and it satisfies no trust rule."""
    from registry.client.oci import client_for
    from registry.digests import digest_of_bytes
    from registry.oci.modelpack import SIGNATURE_ARTIFACT, Descriptor, referrer_manifest
    from registry.oci.reference import OciReference

    repo = _repo(request, oci_registry)
    pt2reg("key", "generate", tmp_path / "other", "--type", "ed25519")
    pt2reg("sign", "team/m@2", "--key", tmp_path / "other.key")
    donor = _push(pt2reg, "team/m@2", f"{repo}-donor:v2")   # a real OMS bundle, by another key
    target = _push(pt2reg, "team/m@2", f"{repo}:v2")
    ref = OciReference.parse(f"{repo}@{target['manifest_digest']}")
    key_id = json.loads(pt2reg("show", "team/m@1", "--json").stdout)["signatures"][0]["key_id"]
    with client_for(OciReference.parse(f"{repo}-donor@{donor['manifest_digest']}"), False) as c:
        (desc,) = [d for d in c.referrers(donor["manifest_digest"]) if d.artifact_type == SIGNATURE_ARTIFACT]
        layer = json.loads(c.get_manifest(desc.digest)[0])["layers"][0]
        body = c.read_blob(layer["digest"], layer["size"], 1 << 20)
    with client_for(ref, False) as c:
        c.upload_blob(digest_of_bytes(body), len(body), lambda o, n: iter([body[o:o + n]]))
        c.upload_blob(digest_of_bytes(b"{}"), 2, lambda o, n: iter([b"{}"[o:o + n]]))
        subject = Descriptor("application/vnd.oci.image.manifest.v1+json", target["manifest_digest"],
                             len(c.get_manifest(target["manifest_digest"])[0]))
        notes = {"dev.pt2reg.key_id": key_id}   # claims the release key
        forged = referrer_manifest(subject, SIGNATURE_ARTIFACT, Descriptor(SIGNATURE_ARTIFACT, digest_of_bytes(body),
                                                                           len(body)), notes)
        c.add_referrer(target["manifest_digest"], forged, SIGNATURE_ARTIFACT, notes)
    r = pt2reg("oci", "referrers", str(ref), "--key", published["pub"])
    assert r.exit_code == 5 and "INVALID" in r.stdout, r.output
    (tmp_path / "c").mkdir()
    _policy(tmp_path / "c", 'models = "team/*"', published["pub"])
    from tests.cli_inprocess import invoker

    r = invoker(tmp_path / "c")("oci", "pull", str(ref), "-o", tmp_path / "f.pt2b")
    refused(r, "must be signed", code=5)


def test_skopeo_reads_what_we_push_and_we_pull_what_skopeo_copies(pt2reg, published, oci_registry, request,
                                                                   tmp_path):
    repo = _repo(request, oci_registry)
    pushed = _push(pt2reg, "team/m@1", f"{repo}:v1")
    raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{repo}:v1"],
                         check=True, capture_output=True).stdout
    assert "sha256:" + hashlib.sha256(raw).hexdigest() == pushed["manifest_digest"]
    manifest = json.loads(raw)
    assert manifest["artifactType"] == "application/vnd.cncf.model.manifest.v1+json"
    assert manifest["config"]["mediaType"] == "application/vnd.cncf.model.config.v1+json"
    roles = [layer["annotations"]["dev.pt2reg.layer"] for layer in manifest["layers"]]
    assert roles.count("bundle") == 1 and roles.count("blob") == len(roles) - 1
    assert all(layer["annotations"]["org.cncf.model.filepath"] for layer in manifest["layers"])
    assert {layer["mediaType"] for layer in manifest["layers"]} <= {
        "application/vnd.cncf.model.weight.v1.raw", "application/vnd.cncf.model.weight.config.v1.raw",
        "application/vnd.cncf.model.dataset.v1.raw"}
    config = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", "--config",
                                        f"docker://{repo}:v1"], check=True, capture_output=True).stdout)
    assert config["config"]["format"] == "pt2b" and config["config"]["precision"] == "fp32"
    assert config["descriptor"]["name"] == "team/m" and config["descriptor"]["version"] == "1"
    assert config["modelfs"]["diffIds"] == [layer["digest"] for layer in manifest["layers"]]

    # our OCI layout, copied by skopeo to another repository, pulls back through pt2reg
    r = pt2reg("oci", "export", "team/m@1", tmp_path / "layout", "--tag", "v1", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["manifest_digest"] == pushed["manifest_digest"]
    copied = _repo(request, oci_registry, "-skopeo")
    subprocess.run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{tmp_path / 'layout'}:v1",
                    f"docker://{copied}:v1"], check=True, capture_output=True)
    # signatures were not copied (a layout has no referrers): the bundle is the unsigned one
    r = pt2reg("oci", "pull", f"{copied}@{pushed['manifest_digest']}", "-o", tmp_path / "s.pt2b", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["digest"] == json.loads(pt2reg("show", "team/m@1", "--json").stdout)["digest"]
    # and skopeo copies our artifact out of the registry into a layout of its own, unchanged
    subprocess.run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{repo}:v1",
                    f"oci:{tmp_path / 'theirs'}:v1"], check=True, capture_output=True)
    index = json.loads((tmp_path / "theirs" / "index.json").read_text())
    assert index["manifests"][0]["digest"] == pushed["manifest_digest"]


def test_materialize_and_load_from_oci(pt2reg, published, oci_registry, request, tmp_path, programs):
    import torch

    import registry

    repo = _repo(request, oci_registry)
    pushed = _push(pt2reg, "team/m@1", f"{repo}:v1")
    uri = f"oci://{repo}@{pushed['manifest_digest']}"
    r = pt2reg("materialize", uri, tmp_path / "bundle", "--layout", "bundle", "--json")
    assert r.exit_code == 0, r.output
    assert pt2reg("pull", "team/m@1", "-o", tmp_path / "direct.pt2b").exit_code == 0
    assert (tmp_path / "bundle" / "m.pt2b").read_bytes() == (tmp_path / "direct.pt2b").read_bytes()
    r = pt2reg("materialize", uri, tmp_path / "files", "--layout", "files")
    assert r.exit_code == 0, r.output
    assert (tmp_path / "files" / "manifest.json").is_file()
    # the Triton layout serves AOTInductor variants only: refused before DEST is made (exit 4)
    r = pt2reg("materialize", uri, tmp_path / "triton")
    refused(r, "AOTInductor", code=4)
    assert not (tmp_path / "triton").exists()
    r = pt2reg("verify", uri, "--device", "cpu")
    assert r.exit_code == 0, r.output
    r = pt2reg("run", uri, "--samples", "--device", "cpu")
    assert r.exit_code == 0, r.output
    import os

    os.environ["PT2REG_HOME"] = str(pt2reg.home)
    try:
        loaded = registry.load(uri, device="cpu")
        (x,) = torch.load(programs / "x.pt")
        eager = torch.export.load(programs / "base.pt2").module()
        torch.testing.assert_close(loaded["model"](x), eager(x), rtol=0, atol=0)
    finally:
        del os.environ["PT2REG_HOME"]


def test_max_layer_size_refuses_before_uploading(pt2reg, published, oci_registry, request):
    repo = _repo(request, oci_registry)
    r = pt2reg("oci", "push", "team/m@1", f"{repo}:v1", "--max-layer-size", "100KiB")
    refused(r, "--max-layer-size", code=2)
    listing = subprocess.run(["skopeo", "list-tags", "--tls-verify=false", f"docker://{repo}"],
                             capture_output=True)
    assert listing.returncode != 0 or json.loads(listing.stdout)["Tags"] == []


def test_chunked_uploads_resume_and_match(pt2reg, published, oci_registry, request, tmp_path, monkeypatch):
    """Blobs over the single-PUT limit go in PATCH chunks (the limits lowered so the 256 KiB
    weights take that path): the artifact pulls back identical."""
    import registry.oci.client as oci_client

    monkeypatch.setattr(oci_client, "MONOLITHIC_MAX", 100_000)
    monkeypatch.setattr(oci_client, "UPLOAD_CHUNK", 70_000)
    monkeypatch.setattr(oci_client.OciClient.upload_blob, "__defaults__", (None, None, 70_000, 100_000))
    repo = _repo(request, oci_registry)
    pushed = _push(pt2reg, "team/m@2", f"{repo}:v2")
    assert pushed["uploaded"] == pushed["layers"] + 1
    r = pt2reg("oci", "pull", f"{repo}@{pushed['manifest_digest']}", "-o", tmp_path / "c.pt2b")
    assert r.exit_code == 0, r.output
    assert pt2reg("pull", "team/m@2", "-o", tmp_path / "d.pt2b").exit_code == 0
    assert (tmp_path / "c.pt2b").read_bytes() == (tmp_path / "d.pt2b").read_bytes()


def _mount(repo: str, digest: str, into: Path) -> None:
    """What an artifact mount (CRI-O image volume, podman type=artifact) or ``oras pull`` makes:
    each layer's blob as a file named by its org.opencontainers.image.title."""
    import urllib.request

    into.mkdir()
    host, _, name = repo.partition("/")
    for layer in _manifest(f"{repo}@{digest}")["layers"]:
        with urllib.request.urlopen(f"http://{host}/v2/{name}/blobs/{layer['digest']}") as answer:
            (into / layer["annotations"]["org.opencontainers.image.title"]).write_bytes(answer.read())


def test_unpack_checks_a_mounted_artifact_before_a_server_starts(pt2reg, published, oci_registry, request, tmp_path):
    repo = _repo(request, oci_registry)
    pushed = _push(pt2reg, "team/m@1", f"{repo}:v1")
    mount = tmp_path / "mnt"
    _mount(repo, pushed["manifest_digest"], mount)
    digest = pushed["digest"]
    r = pt2reg("oci", "unpack", mount, tmp_path / "models", "--bundle-digest", digest, "--layout", "bundle")
    assert r.exit_code == 0, r.output
    assert pt2reg("pull", "team/m@1", "-o", tmp_path / "direct.pt2b").exit_code == 0
    # the mount carries no signatures; read from the registry's referrers they make it the same bytes
    assert (tmp_path / "models" / "m.pt2b").read_bytes() != (tmp_path / "direct.pt2b").read_bytes()
    r = pt2reg("oci", "unpack", mount, tmp_path / "signed", "--bundle-digest", digest, "--layout", "bundle",
               "--referrers-from", f"{repo}@{pushed['manifest_digest']}", "--require-signature", published["pub"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "signed" / "m.pt2b").read_bytes() == (tmp_path / "direct.pt2b").read_bytes()

    # another bundle than the one pinned
    r = pt2reg("oci", "unpack", mount, tmp_path / "x1", "--bundle-digest", "sha256:" + "0" * 64)
    refused(r, "not the", code=5)
    # a policy asking for a signature the mount cannot show
    (tmp_path / "c").mkdir()
    _policy(tmp_path / "c", 'models = "team/*"', published["pub"])
    from tests.cli_inprocess import invoker

    r = invoker(tmp_path / "c")("oci", "unpack", mount, tmp_path / "x2", "--bundle-digest", digest, "--layout", "files")
    refused(r, "must be signed", code=5)
    # a damaged layer file, a missing one (a fresh home: a cache holding the verified member would
    # be used instead of the mount, as it should)
    fresh = invoker(tmp_path / "fresh")
    big = max((p for p in mount.iterdir() if p.name.startswith("sha256-")), key=lambda p: p.stat().st_size)
    data = bytearray(big.read_bytes())
    data[100] ^= 1
    big.write_bytes(bytes(data))
    r = fresh("oci", "unpack", mount, tmp_path / "x3", "--bundle-digest", digest, "--layout", "files")
    refused(r, big.name.replace("sha256-", "sha256:")[:19], code=5)
    big.unlink()
    r = fresh("oci", "unpack", mount, tmp_path / "x4", "--bundle-digest", digest, "--layout", "files")
    refused(r, "lacks layer", code=5)
    assert not any((tmp_path / f"x{i}").exists() for i in range(1, 5))


def test_every_kind_of_registry_pushes_and_pulls_through_oci(reg_env, bundles, oci_registry, request, tmp_path):
    """The version's blobs are read from wherever the registry keeps them (a directory, S3,
    behind a server with a token) and the push is recorded on the version through its own
    store (``POST /v1/oci`` behind a server)."""
    assert reg_env.cli("push", bundles["ed"], "--name", "team/ed").returncode == 0
    repo = _repo(request, oci_registry, f"-{reg_env.kind}")
    r = reg_env.cli("oci", "push", "team/ed@1", f"{repo}:v1", "--json")
    assert r.returncode == 0, r.stderr
    pushed = json.loads(r.stdout)
    shown = json.loads(reg_env.cli("show", "team/ed@1", "--json").stdout)
    assert [a["manifest_digest"] for a in shown["oci"]] == [pushed["manifest_digest"]]
    r = reg_env.cli("oci", "pull", f"{repo}@{pushed['manifest_digest']}", "-o", tmp_path / "back.pt2b",
                    home=tmp_path / "elsewhere")
    assert r.returncode == 0, r.stderr
    assert reg_env.cli("pull", "team/ed@1", "-o", tmp_path / "direct.pt2b").returncode == 0
    assert (tmp_path / "back.pt2b").read_bytes() == (tmp_path / "direct.pt2b").read_bytes()
