"""The S3 blob store against a real S3-compatible server (SeaweedFS): the shared contract, a
100 MB multipart round trip, and corruption planted behind the store's back."""
from __future__ import annotations

import hashlib
import os
import uuid

import pytest

from registry.blobs.s3 import S3BlobStore
from registry.errors import IntegrityError, NotFoundError
from tests.unit.test_blobs_local import MiB, blob, relpath
from tests.unit.test_blobs_s3_moto import SMALL_PARTS, S3ContractHooks
from tests.unit.test_read_range import ReadRangeContract, Sink

pytestmark = pytest.mark.integration

BIG = 100 * 1000 * 1000


@pytest.fixture
def seaweed_env(seaweed_s3, monkeypatch):
    """Point boto3 (through the standard AWS_* variables) at the session's SeaweedFS."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    for name, value in seaweed_s3.env.items():
        monkeypatch.setenv(name, value)
    return seaweed_s3


@pytest.fixture(scope="module")
def bucket(seaweed_s3) -> str:
    return seaweed_s3.new_bucket()


class TestSeaweedBlobStore(S3ContractHooks):
    @pytest.fixture
    def store(self, seaweed_env, bucket) -> S3BlobStore:
        return S3BlobStore(f"s3://{bucket}/{uuid.uuid4().hex[:8]}", **SMALL_PARTS)


class TestSeaweedReadRange(ReadRangeContract):
    """``read_range`` against SeaweedFS: ranged GETs only, a truncated object refused."""

    @pytest.fixture
    def store(self, seaweed_env, bucket) -> S3BlobStore:
        return S3BlobStore(f"s3://{bucket}/{uuid.uuid4().hex[:8]}", **SMALL_PARTS)

    def replace(self, store, digest, data):
        store._s3().put_object(Bucket=store.bucket, Key=store._key(digest), Body=data)

    def test_one_ranged_get_for_the_range_only(self, store, pack, monkeypatch):
        data, digest = pack
        client, answers = store._s3(), []
        real_get = client.get_object

        def get_object(**kwargs):
            response = real_get(**kwargs)
            answers.append((kwargs.get("Range"), response["ContentLength"], response.get("ContentRange")))
            return response

        monkeypatch.setattr(client, "get_object", get_object)
        assert store.read_range(digest, 1_000_000, 300_000) == data[1_000_000:1_300_000]
        assert answers == [("bytes=1000000-1299999", 300_000, f"bytes 1000000-1299999/{len(data)}")]

    @pytest.mark.parametrize("into", [False, True])
    def test_a_body_cut_off_is_resumed_from_the_next_byte(self, store, pack, monkeypatch, into):
        from botocore.exceptions import ResponseStreamingError

        data, digest = pack
        client, ranges = store._s3(), []
        real_get = client.get_object

        def get_object(**kwargs):
            response = real_get(**kwargs)
            ranges.append(kwargs["Range"])
            if len(ranges) == 1:  # the first body breaks after 1000 bytes
                body, real_read = response["Body"], response["Body"].read
                sent = [0]

                def read(amt=None):
                    if sent[0] >= 1000:
                        raise ResponseStreamingError(error="connection broken")
                    chunk = real_read(min(amt, 1000 - sent[0]))
                    sent[0] += len(chunk)
                    return chunk

                body.read = read
            return response

        monkeypatch.setattr(client, "get_object", get_object)
        if into:   # each byte handed over once
            sink = Sink()
            store.read_range_into(digest, 4000, 600_000, sink)
            assert b"".join(sink.pieces) == data[4000:604_000]
        else:
            assert store.read_range(digest, 4000, 600_000) == data[4000:604_000]
        assert ranges == ["bytes=4000-603999", "bytes=5000-603999"]


def sha256_file(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        while chunk := fp.read(MiB):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory):
    """100 MB of random bytes and their digest (default settings: 64 MiB threshold, 8 MiB parts)."""
    path = tmp_path_factory.mktemp("big") / "model.pt2"
    with open(path, "wb") as fp:
        for _ in range(BIG // (4 * MiB)):
            fp.write(os.urandom(4 * MiB))
        fp.write(os.urandom(BIG % (4 * MiB)))
    return path, sha256_file(path)


@pytest.mark.slow
class TestSeaweedLarge:
    def test_100mb_round_trip(self, seaweed_env, big_file, tmp_path):
        path, digest = big_file
        store = S3BlobStore(f"s3://{seaweed_env.new_bucket()}")
        sent, received = [], []
        assert store.put_file(path, digest, progress=sent.append) is True
        assert sum(sent) == BIG
        assert store.put_file(path, digest) is False
        assert store.stat(digest).size == BIG
        keys = [o["Key"] for o in store._s3().list_objects_v2(Bucket=store.bucket)["Contents"]]
        assert keys == [relpath(digest)]
        store.get_file(digest, tmp_path / "out.pt2", progress=received.append)
        assert sum(received) == BIG
        assert sha256_file(tmp_path / "out.pt2") == digest

    def test_100mb_slice_of_a_file(self, seaweed_env, big_file):
        path, _ = big_file
        with open(path, "rb") as fp:
            fp.seek(7 * MiB)
            member = fp.read(70 * MiB)
        data, digest = blob(member)
        store = S3BlobStore(f"s3://{seaweed_env.new_bucket()}/prefix")
        assert store.put_file(path, digest, offset=7 * MiB, length=70 * MiB) is True
        assert store.read_bytes(digest, max_size=70 * MiB) == data

    def test_100mb_corruption_is_caught_on_download(self, seaweed_env, big_file, tmp_path):
        path, digest = big_file
        store = S3BlobStore(f"s3://{seaweed_env.new_bucket()}")
        store.put_file(path, digest)
        forged = tmp_path / "forged"
        with open(path, "rb") as src, open(forged, "wb") as dst:
            dst.write(src.read())
            dst.seek(BIG // 2)
            dst.write(b"\0" * 16)
        store._s3().upload_file(str(forged), store.bucket, relpath(digest))  # raw boto3 overwrite
        dest = tmp_path / "out.pt2"
        with pytest.raises(IntegrityError, match=f"blob {digest} is corrupt in the store"):
            store.get_file(digest, dest)
        assert not dest.exists() and not list(tmp_path.glob("*.incomplete"))


class TestSeaweedSpecifics:
    def test_missing_bucket_is_not_found(self, seaweed_env, tmp_path):
        # SeaweedFS answers a PUT into a missing bucket with AccessDenied, a HEAD with a bare 404
        store = S3BlobStore(f"s3://missing-{uuid.uuid4().hex[:8]}/x")
        data, digest = blob(b"x")
        for call in (lambda: store.put_bytes(data, digest), lambda: store.stat(digest),
                     lambda: store.get_file(digest, tmp_path / "o"), lambda: list(store.list())):
            with pytest.raises(NotFoundError, match="does not exist") as info:
                call()
            assert info.value.what == "bucket"

    def test_layout_without_prefix(self, seaweed_env):
        store = S3BlobStore(f"s3://{seaweed_env.new_bucket()}")
        data, digest = blob(b"root")
        store.put_bytes(data, digest)
        keys = [o["Key"] for o in store._s3().list_objects_v2(Bucket=store.bucket)["Contents"]]
        assert keys == [f"blobs/sha256/{digest[7:9]}/{digest[7:]}"]

    def test_new_bucket_names(self, seaweed_s3):
        names = {seaweed_s3.new_bucket() for _ in range(3)}
        assert len(names) == 3 and all(3 <= len(n) <= 63 for n in names)
        assert seaweed_s3.startup_seconds > 0
