"""The loader on real tiny models: verify, load, validate inputs, run samples, pick variants."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from registry.client.sources import materialize_file  # noqa: E402
from registry.errors import IncompatibleError, InputValidationError, NotFoundError, UnsafeArchiveError  # noqa: E402
from registry.runtime.loader import LoadedBundle, load, load_bundle, verify_bundle  # noqa: E402
from registry.runtime.probe import probe  # noqa: E402
from registry.runtime.target import Target  # noqa: E402
from tests.integration.conftest_models import baked_source_line  # noqa: E402


@pytest.fixture
def open_bundle(tmp_path):
    return lambda built: materialize_file(built.path, tmp_path / "cache")


class _MustNotRun:
    """Stands in for a program's graph: a call reaching it means validation came too late."""

    def __call__(self, *args, **kwargs):
        raise AssertionError("the graph ran before the inputs were validated")


def test_encdec_verifies_runs_samples_and_reproduces_export_outputs(encdec, open_bundle):
    src = open_bundle(encdec)
    report = verify_bundle(src, device="cpu")
    assert report.compatible and report.findings == ()
    bundle = load_bundle(src, device="cpu")
    assert isinstance(bundle, LoadedBundle) and set(bundle) == {"encoder", "decoder"}
    results = bundle.run_samples()
    assert [r.name for r in results] == ["encoder-0", "decoder-0"]
    assert all(r.ok and r.outputs[0]["max_abs"] <= 1e-6 for r in results)
    enc = bundle["encoder"](*encdec.inputs["encoder"])
    torch.testing.assert_close(enc, encdec.expected["encoder"])
    dec = bundle["decoder"](*encdec.inputs["decoder"])
    torch.testing.assert_close(dec, encdec.expected["decoder"])
    hidden, targets = encdec.inputs["decoder"]
    torch.testing.assert_close(bundle["decoder"](hidden=hidden, targets=targets), encdec.expected["decoder"])
    assert bundle["decoder"].variant.id == "portable" and bundle["decoder"].device == "cpu"


@pytest.mark.parametrize("program, make, message", [
    ("encoder", lambda: (torch.randint(0, 32, (9, 4)),), "input 'tokens' dim 0 (batch) is 9, allowed 1..8"),
    ("encoder", lambda: (torch.randn(2, 4),), "input 'tokens' has dtype float32, expected int64"),
    ("encoder", lambda: (torch.randint(0, 32, (2, 40)),), "input 'tokens' dim 1 (seq) is 40, allowed 2..16"),
    ("decoder", lambda: (torch.randn(2, 5, 8), torch.randint(0, 32, (2, 7))),
     "input 'targets' dim 1 (seq + 1) is 7, expected 6 because seq is 5 (from input 'hidden' dim 1)"),
    ("decoder", lambda: (torch.randn(2, 5, 8), torch.randint(0, 32, (3, 6))),
     "input 'targets' dim 0 (batch) is 3, but input 'hidden' dim 0 is 2; they must be equal"),
    ("decoder", lambda: (torch.randn(2, 5, 8),), "the program takes (hidden, targets), got (1 positional)"),
])
def test_bad_inputs_fail_before_the_graph_runs(encdec, open_bundle, program, make, message):
    bundle = load_bundle(open_bundle(encdec), device="cpu")
    bundle[program]._module = _MustNotRun()
    with pytest.raises(InputValidationError) as exc:
        bundle[program](*make())
    assert str(exc.value) == message and exc.value.exit_code == 4


def test_unknown_program_is_named(encdec, open_bundle):
    bundle = load_bundle(open_bundle(encdec), device="cpu", programs=["encoder"])
    assert list(bundle) == ["encoder"]
    with pytest.raises(NotFoundError, match="no loaded program 'decoder'"):
        bundle["decoder"]
    with pytest.raises(NotFoundError, match="no program 'nope'"):
        load_bundle(open_bundle(encdec), programs=["nope"])


def test_load_api_takes_a_file_path(encdec, tmp_path):
    bundle = load(encdec.path, cache_dir=tmp_path / "cache")
    torch.testing.assert_close(bundle["encoder"](*encdec.inputs["encoder"]), encdec.expected["encoder"])


def test_a_one_program_bundle_is_callable_by_ref(pt2_dir, clean_home, tmp_path):
    """The first hour: a ``.pt2`` bundled without NAME= is program "model"; pushed, it runs as
    ``registry.load(ref)(x)``, the same as ``registry.load(ref)["model"](x)`` and as torch's own
    load of the file."""
    import registry
    from tests.fixtures_pt2 import run_cli

    out = tmp_path / "baked.pt2b"
    r = run_cli("bundle", pt2_dir / "baked.pt2", "-o", out)
    assert r.returncode == 0, r.stderr
    r = run_cli("push", out, "--name", "first/hour")
    assert r.returncode == 0, r.stderr
    loaded = registry.load("first/hour@1", device="cpu")
    assert list(loaded) == ["model"]
    x = torch.randn(2, 7)  # exported with batch 2 and a dynamic width 2..64
    expected = torch.export.load(pt2_dir / "baked.pt2").module()(x)
    torch.testing.assert_close(loaded(x), expected)
    torch.testing.assert_close(loaded(x=x), expected)  # keywords pass through too
    torch.testing.assert_close(loaded["model"](x), expected)
    with pytest.raises(InputValidationError, match=r"input 'x' dim 1 .*is 65, allowed 2\.\.64"):
        loaded(torch.randn(2, 65))  # the call is validated as a named program's is


def test_a_bundle_of_several_programs_is_called_by_name(encdec, tmp_path):
    """Calling the bundle itself needs one program: with several, the error names them and the
    way to call one; loading only one of them makes the bundle callable again."""
    from registry.errors import UsageError

    both = load(encdec.path, cache_dir=tmp_path / "cache", device="cpu")
    with pytest.raises(UsageError, match=r"the bundle has programs encoder, decoder; call one by name: "
                                         r"bundle\['encoder'\]"):
        both(*encdec.inputs["encoder"])
    torch.testing.assert_close(both["encoder"](*encdec.inputs["encoder"]), encdec.expected["encoder"])
    only = load(encdec.path, cache_dir=tmp_path / "cache", device="cpu", programs=["decoder"])
    torch.testing.assert_close(only(*encdec.inputs["decoder"]), encdec.expected["decoder"])


def test_load_maps_the_cached_weights_unless_asked_to_copy(encdec, tmp_path):
    """``registry.load`` maps each portable program's verified cache file (docs/decisions.md,
    "Weights are mapped, not copied"); ``map_weights=False`` copies as torch does. Same outputs either way."""
    def mapped_cache_files(cache):
        maps = open("/proc/self/maps").read()
        return {line.split()[-1] for line in maps.splitlines() if str(cache) in line}

    copied = load(encdec.path, cache_dir=tmp_path / "copy", map_weights=False)
    assert mapped_cache_files(tmp_path / "copy") == set()
    bundle = load(encdec.path, cache_dir=tmp_path / "map")
    files = mapped_cache_files(tmp_path / "map")
    assert files and all(f.startswith(str(tmp_path / "map" / "blobs")) for f in files)
    for b in (bundle, copied):
        torch.testing.assert_close(b["encoder"](*encdec.inputs["encoder"]), encdec.expected["encoder"])


def test_incompatible_target_raises_before_any_deserialization(encdec, open_bundle, monkeypatch):
    import registry.runtime.torchrt as torchrt

    def no_load(*a, **k):
        raise AssertionError("deserialized an incompatible bundle")

    monkeypatch.setattr(torchrt, "load_exported_program", no_load)
    here = probe("cpu", cpu_isa=False)
    other = Target.from_json({**here.to_json(), "serde_schema": [9, 0]})
    with pytest.raises(IncompatibleError) as exc:
        load_bundle(open_bundle(encdec), device="cpu", target=other)
    assert exc.value.exit_code == 4 and "serde schema 8." in str(exc.value)
    assert {f.code for f in exc.value.findings} == {"serde-schema"}


def test_custom_op_bundle_is_refused_without_its_op(custom_op, open_bundle):
    with pytest.raises(IncompatibleError) as exc:
        load_bundle(open_bundle(custom_op), device="cpu")
    assert "pt2reg_mylib::scale_add" in str(exc.value) and "--import" in exc.value.one_line()
    assert exc.value.findings[0].code == "custom-op-missing"


def test_a_blocked_program_does_not_block_the_others(custom_op, encdec, open_bundle, tmp_path):
    from registry.bundler import ProgramInput, build_bundle
    from registry.format.bundle import BundleFile

    with_op = BundleFile.open(custom_op.path).extract_member("programs/model.pt2", tmp_path / "with_op.pt2")
    plain = BundleFile.open(encdec.path).extract_member("programs/encoder.pt2", tmp_path / "encoder.pt2")
    mixed = build_bundle(tmp_path / "mixed.pt2b", [ProgramInput("encoder", plain), ProgramInput("model", with_op)])
    src = materialize_file(mixed.path, tmp_path / "cache")
    with pytest.raises(IncompatibleError, match="pt2reg_mylib::scale_add"):
        load_bundle(src, device="cpu")
    bundle = load_bundle(src, device="cpu", programs=["encoder"])
    torch.testing.assert_close(bundle["encoder"](*encdec.inputs["encoder"]), encdec.expected["encoder"])


def test_baked_cpu_program_is_moved_to_another_device(baked, open_bundle):
    src = open_bundle(baked)
    line = baked_source_line()
    assert src.manifest.programs["model"].baked_devices[0].source == line
    # "meta" stands in for a GPU here: the same move_to_device_pass path, no hardware needed.
    bundle = load_bundle(src, device="meta")
    (f,) = bundle.report.findings
    assert (f.severity, f.code) == ("warning", "baked-device") and line in f.message
    out = bundle["model"](torch.randn(2, 7, device="meta"))
    assert out.device.type == "meta" and tuple(out.shape) == (2, 7)
    with pytest.raises(InputValidationError, match="is on cpu, the program runs on meta"):
        bundle["model"](torch.randn(2, 7))
    cpu = load_bundle(src, device="cpu")
    assert cpu.report.findings == () and all(r.ok for r in cpu.run_samples())


def test_pickled_members_are_refused_unless_trusted(pickled, open_bundle):
    src = open_bundle(pickled)
    report = verify_bundle(src, device="cpu")
    assert not report.compatible and [(f.code, f.severity) for f in report.findings] == [("pickle", "error")]
    trusted = verify_bundle(src, device="cpu", trust_pickle=True)
    assert trusted.compatible and [(f.code, f.severity) for f in trusted.findings] == [("pickle", "warning")]
    with pytest.raises(UnsafeArchiveError) as exc:
        load_bundle(src, device="cpu")
    assert exc.value.exit_code == 5 and exc.value.member == "programs/encoder.pt2"
    assert "pickled tensors: data/weights/weight_0" in str(exc.value)
    bundle = load_bundle(src, device="cpu", trust_pickle=True)
    assert bundle["encoder"](torch.randint(0, 32, (2, 3))).shape == (2, 3, 8)


@pytest.mark.slow
def test_aoti_variant_is_chosen_here_and_runs(aoti, open_bundle):
    src = open_bundle(aoti)
    variants = [v.id for v in src.manifest.programs["encoder"].variants]
    assert variants[0] == "portable" and variants[1].startswith("aoti-cpu-")
    # native code of a bundle no trusted key signed: the portable program, and the report says why
    untrusted = load_bundle(src, device="cpu")
    assert untrusted["encoder"].variant.id == "portable"
    assert "native code" in untrusted.report.choices["encoder"][1]
    (note,) = [f for f in untrusted.report.findings if f.code == "native-code"]
    assert note.severity == "info" and variants[1] in note.message and "--trust-native" in note.fix
    bundle = load_bundle(src, device="cpu", trust_native=True)
    assert bundle["encoder"].variant.kind == "aoti"
    assert "matches the target" in bundle.report.choices["encoder"][1]
    torch.testing.assert_close(bundle["encoder"](*aoti.inputs["encoder"]), aoti.expected["encoder"])
    (result,) = bundle.run_samples()
    assert result.ok and result.variant == variants[1]
    # AOTInductor does not check ranges; our validation still does, before the compiled code.
    with pytest.raises(InputValidationError, match=r"dim 1 \(seq\) is 40, allowed 2..16"):
        bundle["encoder"](torch.randint(0, 32, (2, 40)))


@pytest.mark.slow
def test_aoti_other_target_gets_the_portable_program(aoti, open_bundle):
    src = open_bundle(aoti)
    here = probe("cpu", cpu_isa=True)
    for change, words in (({"machine": "aarch64"}, "the target's is aarch64"),
                          ({"cpu_isa": None}, "the target's CPU ISA is unknown"),
                          ({"device_type": "cuda", "compute_capability": [9, 0]}, "built for cpu, the target device is cuda")):
        other = Target.from_json({**here.to_json(), **change})
        report = verify_bundle(src, target=other)
        vid, why = report.choices["encoder"]
        assert vid == "portable" and words in why, why
    bundle = load_bundle(src, device="cpu", target=Target.from_json({**here.to_json(), "machine": "aarch64"}))
    assert bundle["encoder"].variant.id == "portable"
    torch.testing.assert_close(bundle["encoder"](*aoti.inputs["encoder"]), aoti.expected["encoder"])


def test_a_vetting_verdict_is_reused_only_for_the_same_content_and_code(pickled, encdec, tmp_path, monkeypatch):
    """A load remembers that a member passed the graph checks (by its digest and the vetting
    code's); the next load of that content skips them, and still refuses what the first refused."""
    import registry.pt2.reader as reader
    from registry.pt2 import verdicts
    from registry.runtime.sandbox import SandboxConfig

    calls = []
    real = reader.open_pt2
    monkeypatch.setattr(reader, "open_pt2", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    config = SandboxConfig.from_env(tmp_path / "cache", {"PT2REG_SANDBOX": "off"})
    src = materialize_file(encdec.path, tmp_path / "cache")
    load_bundle(src, device="cpu", sandbox=config)
    first = len(calls)
    assert first >= 1
    load_bundle(src, device="cpu", sandbox=config)
    assert len(calls) == first                                   # same content, same code: reused
    monkeypatch.setattr(verdicts, "vetting_code", lambda: "other code")
    load_bundle(src, device="cpu", sandbox=config)
    assert len(calls) == 2 * first                               # other code: vetted again
    monkeypatch.undo()
    bad = materialize_file(pickled.path, tmp_path / "cache")
    for _ in range(2):                                           # the refusal survives the verdict
        with pytest.raises(UnsafeArchiveError, match="pickled tensors: data/weights/weight_0"):
            load_bundle(bad, device="cpu", sandbox=config)
    for record in (tmp_path / "cache" / "vetted-programs").iterdir():
        record.write_text("{not json")                           # a damaged verdict is ignored
    assert "encoder" in load_bundle(src, device="cpu", sandbox=config)
