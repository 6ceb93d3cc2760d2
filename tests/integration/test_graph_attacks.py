"""Held-out code-execution paths of torch.export.load beyond the pickled members of issue 6.

Each payload below was checked to run its command when the crafted file is handed to
``torch.export.load`` directly (see docs/security.md and docs/decisions.md, "A graph is code
too"); here every command ends with 5 and the marker file is never created.
"""
import pytest

from tests.hostile import (
    bundle_with_raw_member,
    evil_pickle,
    pt2_with_dangling_output,
    pt2_with_node_target,
    pt2_with_pickled_constant,
    pt2_with_sympy_payload,
    rewrite_pt2,
)


def _craft(kind, pt2_dir, tmp_path, marker):
    src, dest = pt2_dir / "decoder.pt2", tmp_path / f"{kind}.pt2"
    if kind == "sympy":
        return pt2_with_sympy_payload(src, dest, marker), "is refused before torch reads it"
    if kind == "target":
        return pt2_with_node_target(src, dest, "torch.ops.load_library"), "torch.ops.load_library"
    if kind == "opaque_constant":
        return pt2_with_pickled_constant(src, dest, marker), "data/constants/opaque_obj_0"
    if kind == "legacy_weights":
        return (rewrite_pt2(src, dest, add={"data/weights/model.pt": evil_pickle(marker)}),
                "data/weights/model.pt")
    if kind == "case_folded_samples":
        return (rewrite_pt2(src, dest, add={"DATA/SAMPLE_INPUTS/model.pt": evil_pickle(marker)},
                            drop=("data/sample_inputs/model.pt",)), "DATA/SAMPLE_INPUTS/model.pt")
    if kind == "extra_program":
        return (rewrite_pt2(src, dest, add={"models/sub/model.json": b"{}"}), "models/sub/model.json")
    raise AssertionError(kind)


KINDS = ["sympy", "target", "opaque_constant", "legacy_weights", "case_folded_samples", "extra_program"]
# refused when read at all; the others are pickled members, refused when they would be loaded
STRUCTURAL = {"sympy", "target", "case_folded_samples", "extra_program", "legacy_weights"}


@pytest.mark.parametrize("kind", KINDS)
def test_bundler_refuses_to_deserialize_crafted_pt2(pt2_dir, tmp_path, marker, kind):
    from registry.bundler import ProgramInput, SampleInput, build_bundle
    from registry.errors import UnsafeArchiveError
    from tests.fixtures_pt2 import run_cli

    evil, needle = _craft(kind, pt2_dir, tmp_path, marker)
    out = tmp_path / "x.pt2b"
    if kind in ("sympy", "opaque_constant"):  # through the CLI: one line, exit 5
        r = run_cli("bundle", f"decoder={evil}", "--sample", f"decoder={pt2_dir / 'decoder_inputs.pt'}",
                    "-o", str(out))
        assert r.returncode == 5, r.stderr
        assert needle in r.stderr and "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    else:
        with pytest.raises(UnsafeArchiveError, match=needle.replace(".", r"\.")):
            build_bundle(out, [ProgramInput("decoder", evil)],
                         samples=[SampleInput("decoder", pt2_dir / "decoder_inputs.pt")])
    assert not out.exists()


@pytest.mark.parametrize("kind", KINDS)
def test_crafted_bundle_is_refused_before_torch_sees_it(pt2_dir, bundles, tmp_path, marker, kind):
    from registry.bundler import ProgramInput, build_bundle
    from registry.client.sources import materialize_file
    from registry.errors import UnsafeArchiveError
    from registry.runtime.loader import load_bundle, verify_bundle

    evil, needle = _craft(kind, pt2_dir, tmp_path, marker)
    if kind in STRUCTURAL:  # refused even without samples: nothing of it is bundled
        with pytest.raises(UnsafeArchiveError, match="decoder|model"):
            build_bundle(tmp_path / "x.pt2b", [ProgramInput("decoder", evil)])
    else:  # pickled members bundle (inspectable, pushable) and are refused at load
        build_bundle(tmp_path / "x.pt2b", [ProgramInput("decoder", evil)])
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", "programs/decoder.pt2",
                                     evil.read_bytes())
    src = materialize_file(crafted, tmp_path / "cache")
    try:
        report = verify_bundle(src, device="cpu")
        assert not report.compatible and any(needle in f.message for f in report.findings)
    except UnsafeArchiveError as exc:
        assert needle in str(exc)
    for programs in (None, ["decoder"]):
        with pytest.raises(UnsafeArchiveError) as info:
            load_bundle(src, device="cpu", programs=programs)
        assert needle in str(info.value)
    # a forged graph makes the whole bundle suspect; a pickled member only blocks its program
    if kind in STRUCTURAL:
        with pytest.raises(UnsafeArchiveError):
            load_bundle(src, device="cpu", programs=["encoder"])
    else:
        load_bundle(src, device="cpu", programs=["encoder"])


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
@pytest.mark.parametrize("kind", ["sympy", "opaque_constant"])
def test_crafted_bundle_through_the_cli(reg_env, pt2_dir, bundles, tmp_path, marker, kind):
    evil, needle = _craft(kind, pt2_dir, tmp_path, marker)
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", "programs/decoder.pt2",
                                     evil.read_bytes())
    r = reg_env.cli("push", str(crafted), "--name", "crafted")
    if kind in STRUCTURAL:  # push vets every program as the loader will (see test_canonical_programs)
        assert r.returncode == 5 and needle in r.stderr and "programs/decoder.pt2" in r.stderr, r.stderr
        return
    assert r.returncode == 0, r.stderr
    for args in (["verify", "crafted@1"],
                 ["run", "crafted@1", "--program", "decoder", "--inputs", str(pt2_dir / "decoder_inputs.pt"),
                  "--output", str(tmp_path / "y.pt")]):
        r = reg_env.cli(*args)
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        assert needle in (r.stdout + r.stderr), (args, r.stdout, r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "y.pt").exists()


@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_a_graph_torch_cannot_load_is_one_line_exit_5(reg_env, pt2_dir, bundles, tmp_path):
    broken = pt2_with_dangling_output(pt2_dir / "decoder.pt2", tmp_path / "broken.pt2")
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "broken.pt2b", "programs/decoder.pt2",
                                     broken.read_bytes())
    r = reg_env.cli("run", str(crafted), "--program", "decoder", "--samples")
    assert r.returncode == 5, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "torch could not load program" in lines[0] and "no_such_value" in lines[0], lines
