"""``PT2REG_S3_MULTIPART_THRESHOLD``: where S3 uploads switch to multipart (the crash campaign
lowers it to take the multipart path with small bundles)."""
import pytest

from registry.blobs.s3 import S3BlobStore
from registry.constants import ENV_S3_MULTIPART_THRESHOLD, S3_MULTIPART_THRESHOLD
from registry.errors import UsageError
from tests.fixtures_pt2 import run_cli


def _threshold() -> int:
    return S3BlobStore("s3://bucket/prefix")._transfer_config.multipart_threshold


def test_default_explicit_and_environment(monkeypatch):
    monkeypatch.delenv(ENV_S3_MULTIPART_THRESHOLD, raising=False)
    assert _threshold() == S3_MULTIPART_THRESHOLD == 64 * 1024 * 1024
    monkeypatch.setenv(ENV_S3_MULTIPART_THRESHOLD, "9437184")
    assert _threshold() == 9437184
    assert S3BlobStore("s3://bucket", multipart_threshold=1234)._transfer_config.multipart_threshold == 1234


@pytest.mark.parametrize("value", ["8MiB", "-1", "0", "1e6"])
def test_a_bad_value_is_one_usage_error(value, monkeypatch, tmp_path):
    monkeypatch.setenv(ENV_S3_MULTIPART_THRESHOLD, value)
    with pytest.raises(UsageError, match=ENV_S3_MULTIPART_THRESHOLD):
        _threshold()
    r = run_cli("gc", "--dry-run", env={"PT2REG_HOME": str(tmp_path / "home"),
                                        "PT2REG_STORE": "s3://bucket/prefix"})
    assert r.returncode == 2, (r.stdout, r.stderr)
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("error: ") and ENV_S3_MULTIPART_THRESHOLD in line, line
