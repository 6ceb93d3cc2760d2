"""The server over an S3 store: blob bytes go between the client and S3 through presigned URLs
(moto's server here; SeaweedFS in the integration tier), never through the server."""
from __future__ import annotations

import hashlib
import logging
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from registry.config import Settings
from registry.server import create_app
from tests.services_server import manifest_text


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _s3_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, key: str = "testing") -> None:
    import os

    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(name, raising=False)
    for name, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": key,
                        "AWS_SECRET_ACCESS_KEY": key, "AWS_DEFAULT_REGION": "us-east-1",
                        "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull}.items():
        monkeypatch.setenv(name, value)


def _server(tmp_path: Path, bucket: str) -> Iterator[tuple[TestClient, Any, str]]:
    app = create_app(Settings.resolve(home=str(tmp_path / "home"), store=f"s3://{bucket}/reg", env={}))
    _, admin = app.state.registry.meta.create_token("root", ["admin"], expires_at=None,
                                                     actor="operator", host="ci")
    with TestClient(app, raise_server_exceptions=False) as client:
        client.headers["Authorization"] = f"Bearer {admin}"
        yield client, app, admin


@pytest.fixture
def moto_server_app(tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch):
    import boto3

    _s3_env(monkeypatch, moto_endpoint)
    bucket = f"srv-{uuid.uuid4().hex[:12]}"
    boto3.client("s3").create_bucket(Bucket=bucket)
    yield from _server(tmp_path, bucket)


def _version(name: str, payload: bytes) -> tuple[dict[str, bytes], dict[str, Any]]:
    member = _digest(payload)
    manifest = manifest_text(member, len(payload))
    blobs = {member: payload, _digest(manifest.encode()): manifest.encode()}
    body = {"name": name, "digest": _digest(manifest.encode()), "manifest_json": manifest,
            "size": len(payload) + len(manifest), "blobs": [[d, len(b)] for d, b in blobs.items()], "host": "gpu"}
    return blobs, body


def test_presigned_upload_and_download_skip_the_server(moto_server_app, caplog) -> None:
    client, app, _ = moto_server_app
    caplog.set_level(logging.INFO, logger="registry.server.access")
    blobs, body = _version("team/m", b"tensor" * 1000)
    plan = client.post("/v1/blobs/upload", json={"blobs": [{"digest": d, "size": len(b)}
                                                           for d, b in blobs.items()]})
    assert plan.status_code == 200, plan.text
    assert plan.json()["present"] == []
    for item in plan.json()["missing"]:
        url = urllib.parse.urlsplit(item["url"])
        query = urllib.parse.parse_qs(url.query)
        assert int(query["X-Amz-Expires"][0]) <= 900
        signed = query["X-Amz-SignedHeaders"][0].split(";")
        assert "x-amz-checksum-sha256" in signed and "content-length" in signed
        assert url.path.endswith(item["digest"][7:])  # one object
        assert item["headers"] == {"x-amz-checksum-sha256": app.state.registry.blobs
                                   .full_object_checksum(item["digest"]),
                                   "x-amz-sdk-checksum-algorithm": "SHA256",
                                   "x-amz-meta-pt2reg-uploader": "t1"}  # the admin token's upload
        assert "x-amz-meta-pt2reg-uploader" in signed
        # the client's token never goes to S3: a plain PUT with the listed headers
        put = httpx.put(item["url"], content=blobs[item["digest"]], headers=item["headers"])
        assert put.status_code == 200, put.text
    again = client.post("/v1/blobs/upload", json={"blobs": [{"digest": d, "size": len(b)}
                                                            for d, b in blobs.items()]})
    assert again.json()["missing"] == [] and sorted(again.json()["present"]) == sorted(blobs)
    published = client.post("/v1/publish", json=body)
    assert published.status_code == 200, published.text

    member = body["blobs"][0][0]
    redirect = client.get(f"/v1/blobs/{member}", follow_redirects=False)
    assert redirect.status_code == 307
    location = redirect.headers["location"]
    assert int(urllib.parse.parse_qs(urllib.parse.urlsplit(location).query)["X-Amz-Expires"][0]) <= 900
    assert httpx.get(location).content == blobs[member]
    ranged = httpx.get(location, headers={"Range": "bytes=0-5"})
    assert ranged.status_code == 206 and ranged.content == b"tensor"
    urls = client.post("/v1/blobs/download", json={"digests": list(blobs)}).json()["urls"]
    assert {d: httpx.get(u["url"]).content for d, u in urls.items()} == blobs
    assert urls[member]["size"] == len(blobs[member])

    stats = client.get("/v1/stats").json()
    assert stats["blob_bytes_served"] == 0 and stats["blob_bytes_received"] == 0
    assert stats["presigned_puts"] == 2 and stats["presigned_gets"] >= 3
    assert "presigned" in caplog.text and "X-Amz-Signature" not in caplog.text
    assert client.put(f"/v1/blobs/{member}", content=b"x").status_code == 400


def test_publish_refuses_blobs_s3_cannot_vouch_for(moto_server_app) -> None:
    """A blob stored without the signed checksum (moto does not enforce the signature), or of
    another size, does not count as stored: publish fails and nothing becomes visible."""
    client, app, _ = moto_server_app
    blobs, body = _version("team/n", b"other" * 500)
    plan = client.post("/v1/blobs/upload", json={"blobs": [{"digest": d, "size": len(b)}
                                                           for d, b in blobs.items()]}).json()
    for item in plan["missing"]:
        assert httpx.put(item["url"], content=blobs[item["digest"]]).status_code == 200  # no checksum
    refused = client.post("/v1/publish", json=body)
    assert refused.status_code == 422, refused.text
    assert "missing from the blob store" in refused.json()["error"]["message"]
    assert client.get("/v1/models").json() == {"models": []}
    replan = client.post("/v1/blobs/upload", json={"blobs": [{"digest": d, "size": len(b)}
                                                             for d, b in blobs.items()]}).json()
    assert len(replan["missing"]) == 2  # asked again, this time with the checksum
    for item in replan["missing"]:
        assert httpx.put(item["url"], content=blobs[item["digest"]],
                         headers=item["headers"]).status_code == 200
    assert client.post("/v1/publish", json=body).status_code == 200


@pytest.mark.integration
def test_seaweedfs_verifies_the_signed_checksum(tmp_path: Path, seaweed_s3, monkeypatch) -> None:
    """SeaweedFS refuses a presigned PUT whose body does not hash to the signed
    x-amz-checksum-sha256 (BadDigest), and HEAD with ChecksumMode returns the checksum."""
    _s3_env(monkeypatch, seaweed_s3.endpoint, "any")
    bucket = seaweed_s3.new_bucket()
    for client, app, _ in _server(tmp_path, bucket):
        blobs, body = _version("team/s", b"seaweed" * 300)
        plan = client.post("/v1/blobs/upload", json={"blobs": [{"digest": d, "size": len(b)}
                                                               for d, b in blobs.items()]}).json()
        for item in plan["missing"]:
            data = blobs[item["digest"]]
            wrong = httpx.put(item["url"], content=data[:-1] + b"!", headers=item["headers"])
            assert wrong.status_code == 400 and "BadDigest" in wrong.text
            assert httpx.put(item["url"], content=data, headers=item["headers"]).status_code == 200
            size, checksum = app.state.registry.blobs.head(item["digest"])
            assert (size, checksum) == (len(data), item["headers"]["x-amz-checksum-sha256"])
        assert client.post("/v1/publish", json=body).status_code == 200
        assert client.get("/v1/stats").json()["blob_bytes_served"] == 0
