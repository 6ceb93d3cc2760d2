"""Vetting verdicts shared by bundle, push and load (``registry.pt2.verdicts``): a program member
the bundler vetted is not vetted again by a push or the first load on the same machine, a
verdict of other code or another kind is ignored, and skipping the check never lets other
bytes through (a push verifies every chunk against the member's chunk list). A push writes no
verdict: it checks a file, which need not be the content it publishes."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import registry.pt2.reader as reader  # noqa: E402
from registry.bundler import ProgramInput, build_bundle  # noqa: E402
from registry.client import Registry  # noqa: E402
from registry.config import Settings  # noqa: E402
from registry.digests import hex_of  # noqa: E402
from registry.errors import IntegrityError, NotFoundError  # noqa: E402
from registry.format.bundle import BundleFile  # noqa: E402
from registry.pt2.verdicts import VERDICTS_DIR, read_verdict, verdicts_dir, vetting_code, write_verdict  # noqa: E402
from tests.cli_inprocess import refused  # noqa: E402


class Vetted(Exception):
    """Raised by the stand-in for ``open_pt2``: the graph check ran."""


@pytest.fixture(scope="module")
def pt2(tmp_path_factory) -> Path:
    """A small program whose member is chunked (a 1.2 MiB weight: above ``MIN_MEMBER``)."""
    path = tmp_path_factory.mktemp("verdicts") / "model.pt2"
    model = torch.nn.Sequential(torch.nn.Linear(512, 600, bias=False), torch.nn.ReLU()).eval()
    torch.export.save(torch.export.export(model, (torch.zeros(2, 512),)), path)
    return path


def no_check(monkeypatch) -> None:
    """Make the graph check fail loudly wherever push or load would run it."""
    def refuse(*_a, **_k):
        raise Vetted()
    monkeypatch.setattr(reader, "open_pt2", refuse)


def program_member(bundle: Path):
    opened = BundleFile.open(bundle)
    [member] = [m for m in opened.manifest.members if m.role == "program"]
    return opened, member


def registry_at(home: Path, cache: Path) -> Registry:
    return Registry(Settings.resolve(home=str(home), env={}), cache_dir=cache)


def test_verdict_records_round_trip_and_refuse_what_they_do_not_cover(tmp_path):
    d = tmp_path / "v"
    assert read_verdict(d, "sha256:" + "ab" * 32, "exported_program") is None
    write_verdict(d, "sha256:" + "ab" * 32, "exported_program", ("data/weights/w",), ())
    assert read_verdict(d, "sha256:" + "ab" * 32, "exported_program") == (("data/weights/w",), ())
    assert read_verdict(d, "sha256:" + "ab" * 32, "aoti") is None            # another kind
    assert read_verdict(d, "sha256:" + "cd" * 32, "exported_program") is None  # another member
    assert read_verdict(None, "sha256:" + "ab" * 32, "exported_program") is None
    write_verdict(None, "sha256:" + "ab" * 32, "exported_program", (), ())   # no directory: nothing
    (d / ("ab" * 32 + ".json")).write_text("{not json")
    assert read_verdict(d, "sha256:" + "ab" * 32, "exported_program") is None
    assert verdicts_dir(tmp_path) == tmp_path / VERDICTS_DIR


def test_bundle_writes_a_verdict_and_push_skips_the_check_only_with_it(pt2, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    out = tmp_path / "m.pt2b"
    build_bundle(out, [ProgramInput("model", pt2)], vetted_dir=verdicts_dir(cache))
    _opened, member = program_member(out)
    assert member.chunks, "the test needs a chunked program member"
    assert [p.name for p in verdicts_dir(cache).iterdir()] == [hex_of(member.digest) + ".json"]
    record = json.loads((verdicts_dir(cache) / f"{hex_of(member.digest)}.json").read_text())
    assert record == {"code": vetting_code(), "kind": "exported_program", "tensors": [], "objects": []}

    no_check(monkeypatch)
    with registry_at(tmp_path / "home", cache) as reg:           # bundled here: not vetted again
        assert reg.push(out, "team/m").version.number == 1
    with registry_at(tmp_path / "home2", tmp_path / "other-cache") as reg:  # a bundle from elsewhere
        with pytest.raises(Vetted):
            reg.push(out, "team/m")
    monkeypatch.undo()
    with registry_at(tmp_path / "home2", tmp_path / "other-cache") as reg:  # checked, not remembered
        assert reg.push(out, "team/m").version.number == 1
    assert read_verdict(verdicts_dir(tmp_path / "other-cache"), member.digest, "exported_program") is None


def test_pt2reg_bundle_writes_verdicts_in_the_homes_cache(pt2, tmp_path, pt2reg, monkeypatch):
    out = tmp_path / "m.pt2b"
    assert pt2reg("bundle", f"model={pt2}", "-o", out).exit_code == 0
    _opened, member = program_member(out)
    home_cache = Settings.resolve(home=str(pt2reg.home), env={}).cache_dir
    assert read_verdict(verdicts_dir(home_cache), member.digest, "exported_program") == ((), ())
    assert not (pt2reg.home / "registry.db").exists()   # bundle opens no database
    no_check(monkeypatch)
    result = pt2reg("push", out, "--name", "team/m")
    assert result.exit_code == 0, result.output


def test_a_verdict_of_other_code_or_kind_is_ignored(pt2, tmp_path, monkeypatch):
    cache = tmp_path / "cache"
    out = tmp_path / "m.pt2b"
    build_bundle(out, [ProgramInput("model", pt2)], vetted_dir=verdicts_dir(cache))
    _opened, member = program_member(out)
    record = verdicts_dir(cache) / f"{hex_of(member.digest)}.json"
    good = json.loads(record.read_text())
    no_check(monkeypatch)
    for change in ({"code": "0" * 64}, {"kind": "aoti"}):
        record.write_text(json.dumps({**good, **change}))
        with registry_at(tmp_path / f"home-{next(iter(change))}", cache) as reg:
            with pytest.raises(Vetted):
                reg.push(out, "team/m")


def flip_a_weight_byte(bundle: Path, dest: Path) -> None:
    """A copy of ``bundle`` with one byte changed in the middle of its program's largest chunk."""
    opened, member = program_member(bundle)
    offset, _size = opened.member_span(member.path)
    _sha, at, size = max(member.chunk_spans(), key=lambda c: c[2])
    data = bytearray(bundle.read_bytes())
    data[offset + at + size // 2] ^= 0xFF
    dest.write_bytes(bytes(data))


def test_a_program_altered_after_bundling_is_refused_at_push_despite_its_verdict(pt2, tmp_path, pt2reg,
                                                                                monkeypatch):
    """The verdict names the member's chunk list; the push verifies every chunk it stores (or
    finds stored) against it, so the altered bytes fail the push (exit 5) and nothing is
    recorded: skipping the graph check let nothing else through."""
    out = tmp_path / "m.pt2b"
    assert pt2reg("bundle", f"model={pt2}", "-o", out).exit_code == 0
    bad = tmp_path / "bad.pt2b"
    flip_a_weight_byte(out, bad)
    _opened, member = program_member(bad)
    home_cache = Settings.resolve(home=str(pt2reg.home), env={}).cache_dir
    assert read_verdict(verdicts_dir(home_cache), member.digest, "exported_program") is not None
    no_check(monkeypatch)
    refused(pt2reg("push", bad, "--name", "team/m"), "does not match its digest")
    with registry_at(pt2reg.home, home_cache) as reg, pytest.raises(NotFoundError):
        reg.resolve("team/m")                   # nothing was published
    # the chunks are already stored (the good bundle pushed): the altered file is still refused
    assert pt2reg("push", out, "--name", "team/m").exit_code == 0
    with registry_at(pt2reg.home, home_cache) as reg:
        with pytest.raises(IntegrityError, match="does not match its digest"):
            reg.push(bad, "team/m")
        assert reg.resolve("team/m").number == 1


def test_the_first_load_on_the_bundling_machine_reuses_the_bundlers_verdict(pt2, tmp_path, monkeypatch):
    from registry.client.sources import materialize_file
    from registry.runtime.loader import load_bundle
    from registry.runtime.sandbox import SandboxConfig

    cache = tmp_path / "cache"
    out = tmp_path / "m.pt2b"
    build_bundle(out, [ProgramInput("model", pt2)], vetted_dir=verdicts_dir(cache))
    off = {"PT2REG_SANDBOX": "off"}
    no_check(monkeypatch)
    loaded = load_bundle(materialize_file(out, cache), device="cpu", sandbox=SandboxConfig.from_env(cache, off))
    assert loaded["model"](torch.ones(2, 512)).shape == (2, 600)
    other = tmp_path / "other-cache"
    with pytest.raises(Vetted):   # without the verdict the loader checks the member itself
        load_bundle(materialize_file(out, other), device="cpu", sandbox=SandboxConfig.from_env(other, off))
