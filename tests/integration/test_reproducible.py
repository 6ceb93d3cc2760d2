"""Reproducible, private bundles (issue 15, items 3-5): one module exported from two directories
gives one digest and no machine path; files written for the user follow the umask; programs
keep the order given; baked devices are reported once per source line."""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from registry.bundler import ProgramInput, build_bundle
from registry.format.bundle import BundleFile

ROOT = Path(__file__).resolve().parents[2]

# a library module, installed in a (fake) virtualenv's site-packages of each checkout
LIB = '''
import torch


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x) + torch.ones(4, device="cpu")
'''

# the user's script, outside any package
SCRIPT = '''
import sys

import torch

from tinylib.blocks import Block


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = Block()

    def forward(self, x):
        pos = torch.arange(x.shape[1],
                           device="cpu")
        return self.block(x) + pos + torch.zeros(4, device="cpu")


torch.manual_seed(0)
ep = torch.export.export(Model(), (torch.randn(2, 4),))
# decomposed: from_node metadata then records graph ids (id() of Python objects, new every run)
torch.export.save(ep.run_decompositions(), sys.argv[1])
'''


def _checkout(root: Path) -> Path:
    """A project directory with a script and a virtualenv-like site-packages holding its library."""
    site = root / "venv" / "lib" / "python3.11" / "site-packages" / "tinylib"
    site.mkdir(parents=True)
    (site / "__init__.py").write_text("")
    (site / "blocks.py").write_text(textwrap.dedent(LIB))
    (root / "project").mkdir()
    (root / "project" / "export_model.py").write_text(textwrap.dedent(SCRIPT))
    return root


def _members(bundle: Path) -> dict[str, bytes]:
    """Every member's bytes, and every member of each program archive in it."""
    out = {}
    with zipfile.ZipFile(bundle) as z:
        for name in z.namelist():
            out[name] = z.read(name)
            if name.startswith("programs/"):
                with zipfile.ZipFile(z.open(name)) as inner:
                    out.update({f"{name}!{n}": inner.read(n) for n in inner.namelist()})
    return out


@pytest.fixture(scope="module")
def two_exports(tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, Path]]:
    """The same module exported from two checkouts at different paths, in two processes at once."""
    roots = [_checkout(tmp_path_factory.mktemp("alice-checkout")),
             _checkout(tmp_path_factory.mktemp("bob") / "deeper" / "work")]
    procs = []
    for root in roots:
        env = {**os.environ, "PYTHONPATH": str(root / "venv" / "lib" / "python3.11" / "site-packages")}
        procs.append(subprocess.Popen([sys.executable, "export_model.py", str(root / "model.pt2")],
                                      cwd=root / "project", env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE))
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err.decode()
    return [(root, root / "model.pt2") for root in roots]


def test_two_checkouts_one_digest_and_no_machine_path(two_exports, tmp_path):
    raw = [path.read_bytes() for _, path in two_exports]
    assert str(two_exports[0][0]).encode() in raw[0]  # torch did record the exporter's paths
    results = [build_bundle(tmp_path / f"{i}.pt2b", [ProgramInput("model", path)])
               for i, (_, path) in enumerate(two_exports)]
    assert results[0].digest == results[1].digest
    assert (tmp_path / "0.pt2b").read_bytes() == (tmp_path / "1.pt2b").read_bytes()

    private = {str(root) for root, _ in two_exports} | {
        str(tmp_path), os.path.expanduser("~"), sys.prefix, sys.base_prefix, str(ROOT), "site-packages"}
    private |= {str(Path(p).resolve()) for p in private if p.startswith("/")}
    for name, data in _members(tmp_path / "0.pt2b").items():
        if name == "build.json":  # not part of the identity: who/when/where (user, host)
            continue
        for p in private:
            assert p.encode() not in data, (name, p)

    graph = json.loads(_members(tmp_path / "0.pt2b")["programs/model.pt2!archive/models/model.json"])
    traces = [n["metadata"]["stack_trace"] for n in graph["graph_module"]["graph"]["nodes"]
              if "stack_trace" in n.get("metadata", {})]
    joined = "\n".join(traces)
    assert 'File "export_model.py", line' in joined           # the user's file: its name
    assert 'File "tinylib/blocks.py", line' in joined         # a package file: package-relative
    assert 'File "torch/nn/modules/linear.py", line' in joined
    from_node = [n["metadata"].get("from_node", "") for n in graph["graph_module"]["graph"]["nodes"]]
    assert any('"graph_id": 0' in f for f in from_node)  # numbered, not the exporting process's id()

    # baked devices: path-free sources, one warning per source line, every op in the manifest
    prog = BundleFile.open(tmp_path / "0.pt2b").manifest.programs["model"]
    sources = sorted({b.source for b in prog.baked_devices})
    assert {s.split(":")[0] for s in sources} <= {"export_model.py", "tinylib/blocks.py"}
    assert len(results[0].warnings) == len({(b.device, b.source) for b in prog.baked_devices})
    arange = next(w for w in results[0].warnings if "(arange)" in w)
    assert "pos = torch.arange(x.shape[1], ..." in arange  # torch records the first line only

    # normalizing again changes nothing (the rule is idempotent): re-bundling gives the digest
    BundleFile.open(tmp_path / "0.pt2b").extract_member("programs/model.pt2", tmp_path / "again.pt2")
    again = build_bundle(tmp_path / "again.pt2b", [ProgramInput("model", tmp_path / "again.pt2")])
    assert again.digest == results[0].digest


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("umask, expected", [(0o022, 0o644), (0o077, 0o600)])
def test_user_files_follow_the_umask(pt2reg, pt2_dir, tmp_path, umask, expected):
    import torch

    inputs = tmp_path / "in.pt"
    torch.save((torch.randn(3, 4),), inputs)
    old = os.umask(umask)
    try:
        bundle, pulled, outputs = tmp_path / "m.pt2b", tmp_path / "pulled.pt2b", tmp_path / "out.pt"
        assert pt2reg("bundle", f"decoder={pt2_dir / 'decoder.pt2'}", "-o", bundle).exit_code == 0
        assert pt2reg("push", bundle, "--name", "team/m").exit_code == 0
        assert pt2reg("pull", "team/m@1", "-o", pulled).exit_code == 0
        r = pt2reg("run", bundle, "--inputs", pt2_dir / "decoder_inputs.pt", "--output", outputs)
        assert r.exit_code == 0, r.output
    finally:
        os.umask(old)
    assert {p.name: oct(_mode(p)) for p in (bundle, pulled, outputs)} == \
        {p.name: oct(expected) for p in (bundle, pulled, outputs)}
    blobs = [p for p in (pt2reg.home / "store").rglob("*") if p.is_file()]
    assert blobs and all(_mode(p) & 0o077 == 0 or _mode(p) == 0o444 for p in blobs)


def test_programs_keep_the_order_given(pt2reg, pt2_dir, tmp_path):
    out = tmp_path / "ordered.pt2b"
    r = pt2reg("bundle", f"zdec={pt2_dir / 'decoder.pt2'}", f"aenc={pt2_dir / 'encoder.pt2'}", "-o", out)
    assert r.exit_code == 0, r.output
    manifest = BundleFile.open(out).manifest
    assert manifest.to_json()["program_order"] == ["zdec", "aenc"] and list(manifest.programs) == ["zdec", "aenc"]
    text = pt2reg("inspect", out).output
    assert text.index("zdec") < text.index("aenc")
    view = json.loads(pt2reg("inspect", out, "--json").output)
    assert view["program_order"] == ["zdec", "aenc"]
    report = json.loads(pt2reg("verify", out, "--json").output)
    assert report["program_order"] == ["zdec", "aenc"] and set(report["variants"]) == {"zdec", "aenc"}
    text = pt2reg("verify", out).output
    assert text.index("zdec ") < text.index("aenc ")
