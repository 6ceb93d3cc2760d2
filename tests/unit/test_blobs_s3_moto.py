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
from tests.unit.test_blobs_local import BlobStoreContract, MiB, blob, relpath

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

    def test_stores_share_one_data_loader_whose_paths_never_grow(self, moto_s3):
        from registry.blobs import s3

        for _ in range(3):
            S3BlobStore(f"s3://{moto_s3}")._s3()
        paths = s3._SHARED_LOADER.search_paths
        assert len(paths) == len(set(paths))

    # -- get_parts streams each blob up to the threshold through one ranged GET ----------------
    @staticmethod
    def _stored_parts(store, tmp_path, sizes):
        from registry.blobs.base import Part

        pieces = [os.urandom(n) for n in sizes]
        parts, offset = [], 0
        for piece in pieces:
            digest = blob(piece)[1]
            store.put_bytes(piece, digest)
            parts.append(Part(digest, offset, len(piece)))
            offset += len(piece)
        return b"".join(pieces), parts

    def test_get_parts_streams_small_blobs_one_get_each(self, moto_s3, tmp_path):
        client = raw_client()
        store = S3BlobStore(f"s3://{moto_s3}/p", client=client, **SMALL_PARTS)
        body, parts = self._stored_parts(store, tmp_path, [3 * MiB, 0, 5 * MiB, 17])
        calls = CallCounter(client)
        with open(tmp_path / "out", "wb") as f:
            store.get_parts(f.fileno(), parts)
        assert (tmp_path / "out").read_bytes() == body
        assert calls.counts == {"GetObject": 4}  # no HEAD, one GET per blob

    def test_part_fetches_take_blobs_over_the_streaming_limit_one_at_a_time(self, moto_s3, tmp_path, monkeypatch):
        """With the multipart threshold below the chunk size, each blob over it goes through an
        s3transfer download of its own window: however many threads run the calls, one at a
        time (memory stays one window)."""
        import threading
        import time

        from registry.parallel import run_calls

        store = S3BlobStore(f"s3://{moto_s3}/p", client=raw_client(), **SMALL_PARTS)
        body, parts = self._stored_parts(store, tmp_path, [6 * MiB, 6 * MiB + 1, 7 * MiB, 100, 200])
        lock, now, most, real = threading.Lock(), [0, 0], [0, 0], store._get_part

        def watched(fd, part, progress, inflight, manager):
            big = int(manager is not None)
            with lock:
                now[big] += 1
                most[big] = max(most[big], now[big])
            time.sleep(0.05)
            try:
                return real(fd, part, progress, inflight, manager)
            finally:
                with lock:
                    now[big] -= 1
        monkeypatch.setattr(store, "_get_part", watched)
        with open(tmp_path / "out", "wb") as f:
            run_calls(store.part_fetches(f.fileno(), parts), 5)
        assert (tmp_path / "out").read_bytes() == body
        assert most[1] == 1   # the three big ones one by one

    def test_get_parts_resumes_a_cut_off_body_from_the_next_byte(self, moto_s3, tmp_path, monkeypatch):
        from botocore.exceptions import ResponseStreamingError

        store = S3BlobStore(f"s3://{moto_s3}/p", **SMALL_PARTS)
        body, parts = self._stored_parts(store, tmp_path, [4 * MiB + 5])
        client, ranges = store._s3(), []
        get_object = client.get_object

        class CutOff:
            def __init__(self, inner, after: int) -> None:
                self.inner, self.left = inner, after

            def read(self, n: int) -> bytes:
                if self.left <= 0:
                    raise ResponseStreamingError(error="connection reset by the test")
                data = self.inner.read(min(n, self.left))
                self.left -= len(data)
                return data

            def close(self) -> None:
                self.inner.close()

        def flaky(**kwargs):
            ranges.append(kwargs.get("Range"))
            response = get_object(**kwargs)
            if len(ranges) <= 2:  # the first two answers stop part-way
                response["Body"] = CutOff(response["Body"], 1 * MiB + 3)
            return response

        monkeypatch.setattr(client, "get_object", flaky)
        seen = []
        with open(tmp_path / "out", "wb") as f:
            store.get_parts(f.fileno(), parts, progress=seen.append)
        assert (tmp_path / "out").read_bytes() == body
        size = parts[0].size
        assert ranges == [f"bytes=0-{size - 1}", f"bytes={MiB + 3}-{size - 1}",
                          f"bytes={2 * MiB + 6}-{size - 1}"]
        assert sum(seen) == size

    def test_get_parts_gives_up_after_five_cut_off_bodies(self, moto_s3, tmp_path, monkeypatch):
        from botocore.exceptions import ResponseStreamingError

        store = S3BlobStore(f"s3://{moto_s3}/p", **SMALL_PARTS)
        _body, parts = self._stored_parts(store, tmp_path, [MiB])
        client, calls = store._s3(), []
        get_object = client.get_object

        class Dead:
            def read(self, n: int) -> bytes:
                raise ResponseStreamingError(error="connection reset by the test")

            def close(self) -> None:
                pass

        def dead(**kwargs):
            calls.append(kwargs)
            response = get_object(**kwargs)
            response["Body"].close()
            return {**response, "Body": Dead()}

        monkeypatch.setattr(client, "get_object", dead)
        with open(tmp_path / "out", "wb") as f, pytest.raises(StoreError, match="S3 download of"):
            store.get_parts(f.fileno(), parts)
        assert len(calls) == 5

    def test_get_parts_refuses_an_answer_that_is_not_the_range_asked(self, moto_s3, tmp_path, monkeypatch):
        store = S3BlobStore(f"s3://{moto_s3}/p", **SMALL_PARTS)
        _body, parts = self._stored_parts(store, tmp_path, [MiB])
        client = store._s3()
        get_object = client.get_object
        monkeypatch.setattr(client, "get_object",
                            lambda **kw: get_object(**{k: v for k, v in kw.items() if k != "Range"}))
        with open(tmp_path / "out", "wb") as f, \
                pytest.raises(IntegrityError, match="it answered the whole object"):
            store.get_parts(f.fileno(), parts)

    def test_get_parts_refuses_a_stored_object_of_another_size(self, moto_s3, tmp_path):
        from registry.blobs.base import Part

        store = S3BlobStore(f"s3://{moto_s3}/p", **SMALL_PARTS)
        _body, parts = self._stored_parts(store, tmp_path, [MiB])
        longer = Part(parts[0].digest, 0, MiB + 10)  # a manifest that says otherwise
        with open(tmp_path / "out", "wb") as f, \
                pytest.raises(IntegrityError, match=f"has {MiB} bytes, expected {MiB + 10}"):
            store.get_parts(f.fileno(), [longer])


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


class TestUnrecordedBlobs:
    """A blob no version records is uploaded without a HEAD first (a new model's push costs one
    request per chunk, not two); recorded ones are asked about and skipped when stored intact."""

    def test_put_parts_asks_only_about_recorded_blobs(self, moto_s3, tmp_path):
        from registry.blobs.base import Part

        client = raw_client()
        calls = CallCounter(client)
        store = S3BlobStore(f"s3://{moto_s3}/p", client=client, **SMALL_PARTS)
        pieces = [os.urandom(n) for n in (1000, 2000, 3000)]
        (tmp_path / "src").write_bytes(b"".join(pieces))
        parts, pos = [], 0
        for piece in pieces:
            parts.append(Part(blob(piece)[1], pos, len(piece)))
            pos += len(piece)
        # a leftover object under an unrecorded digest, with other bytes: replaced, not trusted
        client.put_object(Bucket=moto_s3, Key=f"p/{relpath(parts[0].digest)}", Body=b"planted")
        calls.counts.clear()
        assert store.put_parts(tmp_path / "src", parts, unrecorded={p.digest for p in parts}) == (6000, 0)
        assert "HeadObject" not in calls.counts and calls.counts.get("PutObject") == 3
        assert store.read_bytes(parts[0].digest, max_size=1 << 20) == pieces[0]
        calls.counts.clear()
        assert store.put_parts(tmp_path / "src", parts) == (0, 6000)  # recorded: asked, intact, skipped
        assert calls.counts.get("HeadObject") == 3 and "PutObject" not in calls.counts

    def test_an_unrecorded_blob_is_still_verified(self, moto_s3, tmp_path):
        from registry.blobs.base import Part

        store = S3BlobStore(f"s3://{moto_s3}/p", **SMALL_PARTS)
        (tmp_path / "src").write_bytes(b"the bytes on disk")
        wrong = blob(b"the bytes the manifest names")[1]
        with pytest.raises(IntegrityError):
            store.put_parts(tmp_path / "src", [Part(wrong, 0, 17)], unrecorded={wrong})
        assert not store.exists(wrong)

    def test_push_of_a_new_model_sends_no_head(self, moto_s3, tmp_path, bundles):
        from registry.client import Registry
        from registry.config import Settings

        reg = Registry(Settings.resolve(home=str(tmp_path / "home"), store=f"s3://{moto_s3}/reg", env={}))
        calls = CallCounter(reg.blobs._s3())
        first = reg.push(bundles["v0"], "m")
        assert first.uploaded_bytes > 0 and first.skipped_bytes == 0
        # one HEAD per blob at publish (the gc-race check, in the publishing transaction) and
        # one before the manifest's PUT; none before the chunks' uploads (there was one each)
        assert calls.counts.get("HeadObject") == calls.counts.get("PutObject") + 1
        calls.counts.clear()
        second = reg.push(bundles["v1"], "m")  # the same program, other metadata: a new manifest
        assert second.version.number == 2 and second.skipped_bytes > 0  # the shared blobs were recorded
        assert calls.counts.get("HeadObject", 0) >= 1
