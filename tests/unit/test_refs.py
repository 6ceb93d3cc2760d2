import pytest

from registry.errors import UsageError
from registry.refs import Ref, validate_alias, validate_digest, validate_name

HEX = "a" * 64


@pytest.mark.parametrize("text,expected", [
    ("bert", Ref("bert")),
    ("team/bert@7", Ref("team/bert", version=7)),
    ("team/bert@prod", Ref("team/bert", alias="prod")),
    (f"x.y-z_1@sha256:{HEX}", Ref("x.y-z_1", digest=f"sha256:{HEX}")),
])
def test_parse_valid(text, expected):
    ref = Ref.parse(text)
    assert ref == expected
    assert str(ref) == text


@pytest.mark.parametrize("text", [
    "", "Bert", "bert@", "bert@0", "bert@sha256:abc", "bert@sha256:" + "A" * 64, "/bert",
    "team//bert", "a" * 129, "bert@-x", "bert@x y", "../etc", "bert@1@2",
])
def test_parse_invalid_is_usage_error(text):
    with pytest.raises(UsageError) as e:
        Ref.parse(text)
    assert e.value.exit_code == 2
    assert "\n" not in e.value.one_line()


def test_pinned_and_latest():
    assert Ref.parse(f"m@sha256:{HEX}").is_pinned
    assert Ref.parse("m").is_latest
    assert not Ref.parse("m@3").is_latest


@pytest.mark.parametrize("text", ["m@99999999999999999999", "m@²", "m@١", "m@𝟏", "m@01", "m@0"])
def test_versions_are_plain_ascii_numbers(text):
    with pytest.raises(UsageError) as info:
        Ref.parse(text)
    assert info.value.exit_code == 2


@pytest.mark.parametrize("check, text", [(validate_name, "r/m\n"), (validate_alias, "prod\n"),
                                         (validate_digest, "sha256:" + "a" * 64 + "\n")])
def test_a_trailing_newline_is_not_part_of_a_valid_name(check, text):
    with pytest.raises(UsageError):
        check(text)


def test_concurrent_downloads_of_one_blob_do_not_share_a_temp_file(tmp_path):
    import hashlib
    from concurrent.futures import ThreadPoolExecutor

    from registry.blobs.base import atomic_download

    data = b"x" * 100_000
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    dest = tmp_path / "blob"

    def one(_):
        with atomic_download(dest, digest, "test") as w:
            for i in range(0, len(data), 1000):
                w.write(data[i:i + 1000])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(16)))
    assert dest.read_bytes() == data and not list(tmp_path.glob("*.incomplete"))


def test_digests_are_validated_together_as_one_by_one():
    from registry.refs import validate_digests

    good = [f"sha256:{i:064x}" for i in range(1000)]
    assert validate_digests(good) == good and validate_digests(iter(good[:3])) == good[:3]
    for bad in ["sha256:" + "A" * 64, "sha512:" + "a" * 64, "sha256:" + "a" * 63 + "\n", "sha256:" + "a" * 65,
                "sha256: " + "a" * 63, 7, None]:
        with pytest.raises(UsageError, match="invalid digest"):
            validate_digests([*good[:500], bad, *good[500:]])
