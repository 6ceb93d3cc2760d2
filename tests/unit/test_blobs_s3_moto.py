"""The S3 blob store against moto: the shared contract, plus the S3-only behaviour (multipart
uploads and their aborts, bucket errors, endpoint and client configuration)."""
from __future__ import annotations

import io
import os

import boto3
import pytest
from botocore.config import Config

from registry.blobs.s3 import S3BlobStore
from registry.errors import IntegrityError, NotFoundError, StoreError
from tests.unit.test_blobs_local import MiB, BlobStoreContract, blob, relpath

SMALL_PARTS = {"multipart_threshold": 5 * MiB, "multipart_chunksize": 5 * MiB}  # S3's minimum part


def raw_client():
    """A boto3 client configured from the environment the fixtures set (moto or SeaweedFS)."""
    return boto3.session.Session().client("s3")


class S3ContractHooks(BlobStoreContract):
    """The contract's raw hooks for any S3 server; ``big_size`` spans two 5 MiB parts."""

    big_size = 5 * MiB + 123  # two parts, the last one short

    def raw(self, store):
        return store._s3()  # the store's own client: same endpoint, and cheaper than a new one

    def _prefix(self, store) -> str:
        return f"{store.prefix}/" if store.prefix else ""

    def raw_keys(self, store):
        pages = self.raw(store).get_paginator("list_objects_v2").paginate(
            Bucket=store.bucket, Prefix=self._prefix(store))
        return {obj["Key"][len(self._prefix(store)):] for page in pages
                for obj in page.get("Contents", ())}

    def leftovers(self, store):
        uploads = self.raw(store).list_multipart_uploads(Bucket=store.bucket, Prefix=self._prefix(store))
        return [u["Key"] for u in uploads.get("Uploads", ())]

    def corrupt(self, store, digest, data):
        self.raw(store).put_object(Bucket=store.bucket, Key=self._prefix(store) + relpath(digest),
                                   Body=data)

    def add_junk(self, store):
        client, prefix = self.raw(store), self._prefix(store)
        for key in ("tmp/upload.part", "blobs/sha256/ab/not-a-digest", "blobs/sha256/cd/" + "0" * 64,
                    "blobs/sha256/" + "e" * 64, "other/file"):
            client.put_object(Bucket=store.bucket, Key=prefix + key, Body=b"junk")


class TestMotoBlobStore(S3ContractHooks):
    # With 5 MiB parts, the small blobs of the contract go up in one PutObject and ``big_size``
    # in a multipart upload, so one configuration covers both paths.
    @pytest.fixture
    def store(self, moto_s3) -> S3BlobStore:
        return S3BlobStore(f"s3://{moto_s3}/team-a/models/", **SMALL_PARTS)


class CallCounter:
    """Counts the S3 operations a client makes."""

    def __init__(self, client) -> None:
        self.counts: dict[str, int] = {}
        client.meta.events.register("before-call.s3.*", self._count)

    def _count(self, model, **kwargs) -> None:
        self.counts[model.name] = self.counts.get(model.name, 0) + 1


class TestMotoSpecifics:
    def test_key_layout_without_prefix(self, moto_s3):
        store = S3BlobStore(f"s3://{moto_s3}")
        data, digest = blob(b"at the bucket root")
        store.put_bytes(data, digest)
        keys = [o["Key"] for o in raw_client().list_objects_v2(Bucket=moto_s3)["Contents"]]
        assert keys == [f"blobs/sha256/{digest[7:9]}/{digest[7:]}"]

    def test_multipart_upload_and_download(self, moto_s3, tmp_path):
        client = raw_client()
        calls = CallCounter(client)
        store = S3BlobStore(f"s3://{moto_s3}/p", client=client, **SMALL_PARTS)
        data, digest = blob(os.urandom(12 * MiB))
        (tmp_path / "src").write_bytes(data)
        assert store.put_file(tmp_path / "src", digest) is True
        assert calls.counts.get("UploadPart") == 3 and calls.counts.get("CompleteMultipartUpload") == 1
        store.get_file(digest, tmp_path / "out")
        assert (tmp_path / "out").read_bytes() == data
        assert calls.counts.get("GetObject") == 3  # ranged part GETs

    def test_wrong_multipart_content_is_aborted_before_completion(self, moto_s3, tmp_path):
        client = raw_client()
        calls = CallCounter(client)
        store = S3BlobStore(f"s3://{moto_s3}/p", client=client, **SMALL_PARTS)
        data = os.urandom(12 * MiB)
        wrong = blob(data + b"!")[1]
        with pytest.raises(IntegrityError, match="does not match its digest"):
            store.put_stream(io.BytesIO(data), wrong)
        assert calls.counts.get("CreateMultipartUpload") == 1
        assert "CompleteMultipartUpload" not in calls.counts
        assert calls.counts.get("AbortMultipartUpload") == 1
        assert client.list_multipart_uploads(Bucket=moto_s3).get("Uploads", []) == []

    def test_missing_bucket(self, moto_s3, tmp_path):
        store = S3BlobStore("s3://no-such-bucket/x")
        data, digest = blob(b"x")
        for call in (lambda: store.put_bytes(data, digest), lambda: store.stat(digest),
                     lambda: store.exists(digest), lambda: store.get_file(digest, tmp_path / "o"),
                     lambda: store.read_bytes(digest, max_size=9), lambda: list(store.list())):
            with pytest.raises(NotFoundError, match="bucket 'no-such-bucket' does not exist") as info:
                call()
            assert info.value.what == "bucket" and "create it" in info.value.one_line()
        assert not (tmp_path / "o").exists()

    def test_constructor_does_no_io(self):
        store = S3BlobStore("s3://anything/at/all")
        assert store._client is None

    def test_client_config(self, moto_s3):
        config = S3BlobStore(f"s3://{moto_s3}")._s3().meta.config
        assert config.retries == {"total_max_attempts": 11, "mode": "standard"}  # 10 retries
        assert (config.connect_timeout, config.read_timeout) == (10, 120)


class TestEndpoint:
    @pytest.fixture
    def env(self, monkeypatch):
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # discard port: refused
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
        monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
        monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)

    def test_endpoint_comes_from_aws_endpoint_url(self, env):
        assert S3BlobStore("s3://b-1/x")._s3().meta.endpoint_url == "http://127.0.0.1:9"

    def test_unreachable_endpoint_is_a_one_line_store_error(self, env):
        client = boto3.session.Session().client(
            "s3", config=Config(retries={"total_max_attempts": 1}, connect_timeout=1))
        store = S3BlobStore("s3://b-1/x", client=client)
        digest = blob(b"x")[1]
        with pytest.raises(StoreError) as info:
            store.exists(digest)
        message = str(info.value)
        assert "\n" not in message and "http://127.0.0.1:9" in message
        assert f"s3://b-1/x/blobs/sha256/{digest[7:9]}/{digest[7:]}" in message
