"""OCI references and the ModelPack form of a version, read back with hostile inputs (issue 43)."""
from __future__ import annotations

import json

import pytest

from registry.digests import canonical_json, digest_of_bytes
from registry.errors import IntegrityError, UsageError
from registry.oci.modelpack import (
    BUNDLE_MEDIA,
    MODEL_ARTIFACT,
    MODEL_CONFIG,
    ROLE,
    ROLE_BUNDLE,
    ArtifactLayout,
    BundleLayer,
    Descriptor,
    build_manifest,
    precision_of,
)
from registry.oci.reference import OciReference, is_loopback

HEX = "a" * 64


@pytest.mark.parametrize("text, host, repo, tag, digest", [
    ("ghcr.io/team/m:v1", "ghcr.io", "team/m", "v1", None),
    ("oci://127.0.0.1:5000/team/m@sha256:" + HEX, "127.0.0.1:5000", "team/m", None, "sha256:" + HEX),
    ("localhost:5000/a/b/c:1.0@sha256:" + HEX, "localhost:5000", "a/b/c", "1.0", "sha256:" + HEX),
    ("Registry.Example.COM/m-x__y.z", "registry.example.com", "m-x__y.z", None, None),
    ("[::1]:5000/m", "[::1]:5000", "m", None, None),
])
def test_references_parse(text, host, repo, tag, digest):
    ref = OciReference.parse(text)
    assert (ref.host, ref.repository, ref.tag, ref.digest) == (host, repo, tag, digest)
    assert OciReference.parse(str(ref)) == ref


@pytest.mark.parametrize("text, needle", [
    ("team/m:v1", "registry host"),                       # no host: never Docker Hub by default
    ("ghcr.io", "no repository"),
    ("ghcr.io/", "no repository"),
    ("ghcr.io/Team/m", "bad repository"),
    ("ghcr.io/team//m", "bad repository"),
    ("ghcr.io/../m", "bad repository"),
    ("ghcr.io/m:-bad", "bad tag"),
    ("ghcr.io/m@sha256:abc", "sha256 digest"),
    ("ghcr.io/m@md5:" + HEX, "sha256 digest"),
    ("https://ghcr.io/m", "only oci://"),
    ("oci://user:pw@ghcr.io/m", "sha256 digest"),
    ("gh cr.io/m", "registry host"),
    ("ghcr.io/" + "a" * 300, "bad repository"),
    ("", "empty"),
])
def test_bad_references_are_one_clear_line(text, needle):
    with pytest.raises(UsageError) as exc:
        OciReference.parse(text)
    assert needle in str(exc.value)


def test_loopback_is_plain_http_and_everything_else_https():
    assert is_loopback("127.0.0.1:5000") and is_loopback("localhost:1") and is_loopback("[::1]:5000")
    assert not is_loopback("10.0.0.1:5000") and not is_loopback("localhost.evil.com:5000")
    assert OciReference.parse("10.0.0.1:5000/m").scheme(insecure=False) == "https"
    assert OciReference.parse("10.0.0.1:5000/m").scheme(insecure=True) == "http"
    assert OciReference.parse("127.0.0.2/m").scheme(insecure=False) == "http"


def test_a_tagless_unpinned_reference_has_nothing_to_read():
    with pytest.raises(UsageError, match="neither a tag nor a digest"):
        OciReference.parse("ghcr.io/m").reference  # noqa: B018


def _artifact(layers: list[dict], **over) -> bytes:
    doc = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
           "artifactType": MODEL_ARTIFACT,
           "config": {"mediaType": MODEL_CONFIG, "digest": "sha256:" + "c" * 64, "size": 10}, "layers": layers}
    doc.update(over)
    return json.dumps(doc).encode()


_BUNDLE = {"mediaType": BUNDLE_MEDIA, "digest": "sha256:" + "b" * 64, "size": 5, "annotations": {ROLE: ROLE_BUNDLE}}
_BLOB = {"mediaType": "application/vnd.cncf.model.weight.v1.raw", "digest": "sha256:" + "d" * 64, "size": 7,
         "annotations": {ROLE: "blob"}}


def test_an_artifact_reads_back():
    art = ArtifactLayout.parse(_artifact([_BUNDLE, _BLOB]))
    assert art.bundle.digest == _BUNDLE["digest"] and set(art.layers) == {_BUNDLE["digest"], _BLOB["digest"]}


@pytest.mark.parametrize("data, needle", [
    (b"not json", "not JSON"),
    (b"[]", "not a JSON object"),
    (_artifact([_BUNDLE], artifactType="application/vnd.other", config={
        "mediaType": "application/vnd.oci.image.config.v1+json", "digest": "sha256:" + "c" * 64, "size": 1}),
     "not a ModelPack model"),
    (_artifact([_BLOB]), "0 pt2reg bundle layers"),
    (_artifact([_BUNDLE, dict(_BUNDLE, digest="sha256:" + "e" * 64)]), "2 pt2reg bundle layers"),
    (_artifact([_BUNDLE, dict(_BLOB, size=-1)]), "not a sha256 descriptor"),
    (_artifact([_BUNDLE, dict(_BLOB, size="7")]), "not a sha256 descriptor"),
    (_artifact([_BUNDLE, dict(_BLOB, digest="sha512:" + "d" * 128)]), "not a sha256 descriptor"),
    (_artifact([_BUNDLE, _BLOB, dict(_BLOB, size=8)]), "two sizes"),
    (_artifact([_BUNDLE, dict(_BLOB, annotations={ROLE: 3})]), "annotations"),
    (_artifact([_BUNDLE], schemaVersion=1), "not an OCI image manifest"),
    (_artifact("x"), "no layers"),
    (b" " * (4 * 1024 * 1024 + 1), "more than"),
])
def test_hostile_artifact_manifests_are_integrity_errors(data, needle):
    with pytest.raises(IntegrityError) as exc:
        ArtifactLayout.parse(data)
    assert needle in str(exc.value) and "not a pt2reg model" in str(exc.value)


def _layer(**over) -> bytes:
    doc = {"mediaType": "application/vnd.pt2reg.oci-bundle.v1+json", "digest": "sha256:" + HEX, "name": "team/m",
           "version": 3, "manifest": "{}", "packs": None, "build": None}
    doc.update(over)
    return canonical_json(doc)


def test_the_bundle_layer_round_trips():
    layer = BundleLayer("sha256:" + HEX, "team/m", 3, "{}", None, {"tool": "x"})
    assert BundleLayer.from_bytes(layer.to_bytes()) == layer


@pytest.mark.parametrize("over", [
    {"mediaType": "application/json"}, {"digest": "sha256:xyz"}, {"name": "../etc"}, {"name": "Team/M"},
    {"name": "m.pt2b"}, {"version": 0}, {"version": "3"}, {"version": True}, {"manifest": {}}, {"packs": []},
    {"build": "x"},
])
def test_a_hostile_bundle_layer_is_refused(over):
    with pytest.raises(IntegrityError):
        BundleLayer.from_bytes(_layer(**over))


def test_the_manifest_is_canonical_and_its_digest_stable():
    layers = [Descriptor(BUNDLE_MEDIA, "sha256:" + HEX, 9, {ROLE: ROLE_BUNDLE})]
    a = build_manifest(b"{}", layers, annotations={"x": "1"})
    assert a == build_manifest(b"{}", layers, annotations={"x": "1"})
    assert digest_of_bytes(a) == digest_of_bytes(canonical_json(json.loads(a)))


@pytest.mark.parametrize("dtypes, want", [
    (["torch.float32"], "fp32"), (["float16", "float16"], "fp16"), (["bfloat16", "float32"], "mixed"),
    (["bool"], None), ([], None), (["int8", "bool"], "int8"),
])
def test_precision(dtypes, want):
    assert precision_of(dtypes) == want
