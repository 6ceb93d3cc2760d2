"""``torchrt.op_schemas``' memo: named by the torch installation it was read from (found without
importing torch), so another torch never answers from it; only built-in operators are kept."""
import json
import os

from registry.runtime.torchrt import op_schemas, version


def _fake_torch(root, version_text="__version__ = '2.13.0+cpu'\ncuda = None\n"):
    (root / "lib").mkdir(parents=True, exist_ok=True)
    (root / "__init__.py").write_text("")
    (root / "version.py").write_text(version_text)
    (root / "lib" / "libtorch_cpu.so").write_bytes(b"\0" * 16)
    return root


def test_the_installation_key_changes_with_the_torch_installed(tmp_path, monkeypatch):
    root = _fake_torch(tmp_path / "torch")
    monkeypatch.setattr(version, "_torch_root", lambda: root)
    key = version.installation_key()
    assert key is not None and version.installation_key() == key
    assert version.installed_version() == ("2.13.0+cpu", None)
    (root / "version.py").write_text("__version__ = '2.14.1+cu130'\ncuda = '13.0'\n")   # an upgrade
    assert version.installation_key() != key and version.installed_version() == ("2.14.1+cu130", "13.0")
    upgraded = version.installation_key()
    os.utime(root / "lib" / "libtorch_cpu.so", ns=(1, 1))   # a rebuilt library, same version text
    assert version.installation_key() not in (key, upgraded)
    monkeypatch.setattr(version, "_torch_root", lambda: None)
    assert version.installation_key() is None and version.installed_version() is None


def test_only_registered_builtin_operators_are_remembered(tmp_path):
    targets = ["torch.ops.aten.relu.default", "torch.ops.nosuchlib.op.default", "torch.ops.aten.nosuchop.default"]
    got = op_schemas(targets, tmp_path)
    assert got["torch.ops.aten.relu.default"] == "aten::relu(Tensor self) -> Tensor"
    assert got["torch.ops.nosuchlib.op.default"] is None and got["torch.ops.aten.nosuchop.default"] is None
    [memo] = tmp_path.glob("*.json")
    assert json.loads(memo.read_text()) == {"torch.ops.aten.relu.default": "aten::relu(Tensor self) -> Tensor"}
    assert memo.stem == version.installation_key()
    assert op_schemas(targets[:1], None) == {targets[0]: got[targets[0]]}
