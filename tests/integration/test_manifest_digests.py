"""The typed manifest changes no bundle's bytes (issue 16, item 2).

1. Round trip: for every fixture bundle the suite builds, ``Manifest.from_bytes(b).to_json()``
   (rebuilt from the typed ``ProgramSpec``/``TensorSpec``/``Dim``/... values, not a kept copy of
   the input) is byte-identical, as canonical JSON, to the manifest read from the bundle.
2. Golden digests: the small bundles built now have the digests the code before the typed
   manifest gave them (``manifest_digests.json``, recorded from commit aa0b15e with
   ``python -m tests.integration.test_manifest_digests OUT.json`` run on that checkout, this
   file and ``tests/golden_models.py`` copied in). Format 2 (issue 17) changed every digest
   and they were re-recorded: the manifests the code of commit 5d23abf writes for the same
   bundles, with ``"format": 2`` and the whole-member sha256 of chunked members removed (and
   nothing else changed), hash to exactly the digests recorded now (checked then, 12 of 12).
   Entry-level chunking (issue 17, packs) changed the digests of the two bundles with a chunked
   member (``big_bundle/small``, ``golden/wide``) and they were re-recorded: the manifests the
   new code writes, with each chunked member's chunk list replaced by the one the previous plan
   makes of the same bytes (tiny entries coalesced) and nothing else changed, hash to exactly
   the digests recorded before (checked then, 12 of 12; the other 10 are unchanged). Recording
   where golden samples were computed (issue 40, ``samples[].device``) changed the digests of
   the 7 bundles with samples and they were re-recorded: the manifests the new code writes,
   with that field removed from every sample and nothing else changed, hash to exactly the
   digests recorded before (checked then, 12 of 12; the other 5 are unchanged). Recording each
   program's compatibility window and operators (issue 42: ``serialization.window``,
   ``operators``, an AOTInductor target's ``torch_version``/``cxx11_abi``) and deriving the
   torch requirement from the windows (``>=2.10`` where it was the exporter's ``>=2.13``)
   changed all 12 and they were re-recorded: the manifests the new code writes, with those
   fields removed and the requirement set back to the exporter's major.minor (and nothing else
   changed), hash to exactly the digests recorded before (checked then, 12 of 12). ruff's
   reformatting of ``tests/integration/conftest_models.py`` and ``tests/ops_mylib.py`` (issue 44)
   moved the source lines of four fixtures' models (their stack traces are in the graph) and they
   were re-recorded: the code of that commit, given those two files as they were before ruff,
   writes bundles that hash to exactly the digests recorded before (checked then, 12 of 12).

A digest depends on the torch/Python that built it (the manifest's ``environment``), on the
line numbers of the models' source (graph stack traces), and on the last bits of the golden
sample outputs computed at bundle time: those depend on the CPU kernels that ran (an AVX-512
machine gives other bits than the AVX2 one the digests were recorded on) and on the number of
threads a reduction is split over. So the golden bundles are built, for the comparison and for
recording, in a child process pinned to AVX2-level kernels and 2 threads (``PINNED_NUMERICS``),
which every x86-64 machine provides. The bundles of ``tests.golden_models``
come from a file nothing else edits, so they are always compared (on the recorded torch and
Python); editing the files a fixture bundle's models come from fails this test until the digests are
re-recorded (with the code of that commit), so no comparison is ever silently dropped.
"""
from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path

import pytest

from registry.digests import canonical_json
from registry.format.manifest import Manifest

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).with_name("manifest_digests.json")
#: per bundle name prefix, the files whose line numbers (graph stack traces) reach its digest
SOURCES = {"golden/": ("tests/golden_models.py",),
           "pt2_dir/": ("tests/make_models.py", "examples/translator.py"),
           "fixture/": ("tests/integration/conftest_models.py", "tests/ops_mylib.py"),
           "big_bundle/": ("tests/big_bundle.py",)}
#: what pins the numerics of the golden samples (see the module docstring): ATen's, oneDNN's and
#: MKL's kernels at AVX2, and torch's intra-op threads at 2 (the recording machine's)
PINNED_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2",
                   "OMP_NUM_THREADS": "2"}
#: (name, fixture) of the conftest_models bundles; aoti is compiled (not reproducible): round trip only
FIXTURES = ("encdec", "custom_op", "baked", "pickled")


def _manifest_bytes(path: Path) -> bytes:
    """``manifest.json`` as stored in the bundle (read as plain zip bytes, not through Manifest)."""
    with zipfile.ZipFile(path) as zf:
        return zf.read("manifest.json")


def pt2_dir_bundles(pt2_dir: Path, out: Path) -> dict[str, Path]:
    """Bundles of the ``tests.make_models`` files, as the CLI tests make them."""
    from registry.bundler import ProgramInput, SampleInput, build_bundle

    out.mkdir(parents=True, exist_ok=True)
    specs = {
        "translator": ([ProgramInput("encoder", pt2_dir / "encoder.pt2"),
                        ProgramInput("decoder", pt2_dir / "decoder.pt2")],
                       [SampleInput("encoder", pt2_dir / "encoder_inputs.pt"),
                        SampleInput("decoder", pt2_dir / "decoder_inputs.pt")]),
        "custom_op": ([ProgramInput(None, pt2_dir / "custom_op.pt2")], []),
        "baked": ([ProgramInput("model", pt2_dir / "baked.pt2")], []),
        "heldout": ([ProgramInput(n, pt2_dir / f"{n}.pt2") for n in ("masked", "flat", "guarded", "halves")],
                    [SampleInput("masked", pt2_dir / "masked_inputs.pt")]),
        "flagged": ([ProgramInput("flagged", pt2_dir / "flagged.pt2")],
                    [SampleInput("flagged", pt2_dir / "flagged_inputs.pt")]),
    }
    paths = {}
    for name, (programs, samples) in specs.items():
        paths[f"pt2_dir/{name}"] = out / f"{name}.pt2b"
        build_bundle(paths[f"pt2_dir/{name}"], programs, samples=samples, metadata={"fixture": name})
    return paths


def small_big_bundle(out: Path) -> Path:
    """``tests.big_bundle`` at a small size (its members still chunked)."""
    from tests.big_bundle import BigBundles

    return BigBundles(out, hidden=640, small=1).make(0)


@pytest.fixture(scope="module")
def built(pt2_dir, tmp_path_factory, request) -> dict[str, Path]:
    paths = {f"fixture/{name}": request.getfixturevalue(name).path for name in FIXTURES}
    paths.update(pt2_dir_bundles(pt2_dir, tmp_path_factory.mktemp("digests")))
    paths["big_bundle/small"] = small_big_bundle(tmp_path_factory.mktemp("digests-big"))
    from tests.golden_models import build

    paths.update(build(tmp_path_factory.mktemp("digests-golden")))
    return paths


def test_typed_manifest_round_trips_every_fixture_bundle(built):
    for name, path in built.items():
        data = _manifest_bytes(path)
        manifest = Manifest.from_bytes(data)
        assert canonical_json(manifest.to_json()) == data, name
        assert manifest.canonical == data and manifest.digest == "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.mark.slow
def test_typed_manifest_round_trips_the_aoti_bundle(aoti):
    data = _manifest_bytes(aoti.path)
    assert canonical_json(Manifest.from_bytes(data).to_json()) == data


def _environment() -> dict:
    from registry.runtime.torchrt import environment

    return environment()


def _sources(name: str) -> dict[str, str]:
    files = next(files for prefix, files in SOURCES.items() if name.startswith(prefix))
    return {p: hashlib.sha256((ROOT / p).read_bytes()).hexdigest() for p in files}


def digests_of(paths: dict[str, Path]) -> dict[str, dict]:
    return {name: {"digest": Manifest.from_bytes(_manifest_bytes(path)).digest, "sources": _sources(name)}
            for name, path in sorted(paths.items())}


def test_digests_equal_those_of_the_code_before_the_typed_manifest(tmp_path):
    golden = json.loads(GOLDEN.read_text())
    if golden["environment"] != _environment():
        pytest.skip(f"recorded with {golden['environment']}, this is {_environment()}")
    _record(tmp_path / "digests.json", tmp_path / "child")
    recorded_now = json.loads((tmp_path / "digests.json").read_text())
    assert recorded_now["environment"] == golden["environment"]
    now = recorded_now["bundles"]
    assert set(now) == set(golden["bundles"])
    edited = sorted(name for name, g in golden["bundles"].items() if g["sources"] != now[name]["sources"])
    assert not edited, (f"the model sources of {edited} changed since the digests were recorded: re-record "
                        "them with `python -m tests.integration.test_manifest_digests "
                        "tests/integration/manifest_digests.json` (and say so in the commit)")
    assert {n: g["digest"] for n, g in now.items()} == {n: g["digest"] for n, g in golden["bundles"].items()}


def _record(out: Path, scratch: Path) -> None:
    """Build the golden bundles with this checkout's code in a child pytest (it runs the
    fixtures), its numerics pinned (``PINNED_NUMERICS``), and write their digests to ``out``;
    the child's script and temporary files go in ``scratch``."""
    import os
    import subprocess

    scratch.mkdir(parents=True, exist_ok=True)
    script = scratch / "test_record_digests.py"
    script.write_text("import json\n"
                      "from tests.integration import test_manifest_digests as t\n"
                      "def test_record(built):\n"
                      "    doc = {'environment': t._environment(), 'bundles': t.digests_of(built)}\n"
                      f"    open({str(out)!r}, 'w').write(json.dumps(doc, indent=1, sort_keys=True) + '\\n')\n")
    child = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "--noconftest",
         "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"), "--basetemp", str(scratch / "tmp"),
         "-p", "tests.fixtures_pt2", "-p", "tests.integration.conftest_models",
         "-p", "tests.integration.test_manifest_digests", str(script)],
        cwd=ROOT, env={**os.environ, **PINNED_NUMERICS, "PYTHONPATH": str(ROOT)},
        capture_output=True, text=True, timeout=600)
    assert child.returncode == 0, f"building the golden bundles failed:\n{child.stdout[-4000:]}{child.stderr[-2000:]}"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as scratch_dir:
        _record(Path(sys.argv[1]).absolute(), Path(scratch_dir))
