import pytest

from registry.errors import UsageError
from registry.refs import Ref

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
