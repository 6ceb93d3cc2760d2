"""Issue 6: nothing from a bundle is ever unpickled unsafely.

Each artifact carries a pickle that would ``touch`` a marker file if it were ever unpickled;
every test ends by proving the marker does not exist.
"""
import pytest

from tests.hostile import bundle_with_raw_member, pt2_with_evil_sample_inputs, pt2_with_pickled_weight


# what is unpickled depends on the bundle, not on where it is stored: the local store suffices
@pytest.mark.slow
@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
def test_evil_sample_inputs_are_stripped_by_the_bundler(reg_env, pt2_dir, tmp_path, marker):
    evil = pt2_with_evil_sample_inputs(pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker)
    out = tmp_path / "evil.pt2b"
    r = reg_env.cli("bundle", f"decoder={evil}", "--sample", f"decoder={pt2_dir / 'decoder_inputs.pt'}",
                    "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert reg_env.cli("push", str(out), "--name", "evil").returncode == 0
    r = reg_env.cli("verify", "evil@1")
    assert r.returncode == 0, r.stdout + r.stderr
    r = reg_env.cli("run", "evil@1", "--samples")
    assert r.returncode == 0, r.stdout + r.stderr
    r = reg_env.cli("run", "evil@1", "--inputs", str(pt2_dir / "decoder_inputs.pt"), "--output",
                    str(tmp_path / "y.pt"))
    assert r.returncode == 0, r.stderr


@pytest.mark.slow
@pytest.mark.parametrize("reg_env", ["local"], indirect=True)
@pytest.mark.parametrize("attack", ["sample_inputs", "pickled_weight"])
def test_crafted_bundle_with_pickles_is_refused_before_deserialization(reg_env, pt2_dir, bundles, tmp_path,
                                                                       marker, attack):
    if attack == "sample_inputs":
        evil = pt2_with_evil_sample_inputs(pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker)
        member_entry = "data/sample_inputs/model.pt"
    else:
        evil = pt2_with_pickled_weight(pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker)
        member_entry = "data/weights/weight_0"
    crafted = bundle_with_raw_member(bundles["ed"], tmp_path / "crafted.pt2b", "programs/decoder.pt2",
                                     evil.read_bytes())
    r = reg_env.cli("inspect", str(crafted))
    assert r.returncode == 0, r.stderr  # inspecting reads JSON only
    assert reg_env.cli("push", str(crafted), "--name", "crafted").returncode == 0
    for args in (["verify", "crafted@1"], ["run", "crafted@1", "--samples"],
                 ["run", "crafted@1", "--program", "decoder", "--inputs", str(pt2_dir / "decoder_inputs.pt"),
                  "--output", str(tmp_path / "y.pt")],
                 ["verify", str(crafted)], ["run", str(crafted), "--samples"]):
        r = reg_env.cli(*args)
        assert r.returncode == 5, (args, r.stdout, r.stderr)
        assert "programs/decoder.pt2" in (r.stdout + r.stderr) and member_entry in (r.stdout + r.stderr)
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "y.pt").exists()


def test_bundler_refuses_to_unpickle_weights_for_samples(pt2_dir, tmp_path, marker):
    from tests.fixtures_pt2 import run_cli

    evil = pt2_with_pickled_weight(pt2_dir / "decoder.pt2", tmp_path / "evil.pt2", marker)
    out = tmp_path / "x.pt2b"
    r = run_cli("bundle", f"decoder={evil}", "--sample", f"decoder={pt2_dir / 'decoder_inputs.pt'}", "-o", str(out))
    assert r.returncode == 5 and "pickled" in r.stderr and "--trust-pickle" in r.stderr, r.stderr
    assert not out.exists()
    # without samples nothing is deserialized: it bundles (the loader refuses it later)
    r = run_cli("bundle", f"decoder={evil}", "-o", str(out))
    assert r.returncode == 0, r.stderr
