"""``scripts/gpu_check.py``: the one GPU check, in its quick form on this machine's CPU (every
CI run) and on a GPU where there is one (``pytest -m gpu``)."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _check(device: str, tmp_path: Path, *extra: str) -> dict:
    report = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", device, "--quick", "--report", str(report),
                           *extra], capture_output=True, text=True, timeout=1500)
    assert report.is_file(), done.stderr[-3000:]
    doc = json.loads(report.read_text())
    assert done.returncode == (0 if doc["passed"] else 1)
    return doc


@pytest.mark.slow
def test_the_quick_check_passes_on_the_cpu(tmp_path):
    doc = _check("cpu", tmp_path)
    failed = [s for s in doc["steps"] if not s["ok"]]
    assert doc["passed"] and not failed, json.dumps(failed, indent=1)[:4000]
    names = [s["step"] for s in doc["steps"]]
    for needed in ("target", "export on the device", "bundle cnn", "push cnn", "verify cnn for cpu",
                   "run --samples cnn on cpu (first run)", "run cnn with batch 17 (allowed 1..16)",
                   "registry.load on cpu and a wrong-device input", "attest cnn on cpu"):
        assert needed in names
    assert {"step", "ok", "exit_code", "seconds", "message"} <= set(doc["steps"][0])
    assert doc["device"] == "cpu" and doc["torch"] == torch.__version__ and doc["quick"] is True
    target = next(s for s in doc["steps"] if s["step"] == "target")
    assert target["data"]["target"]["device_type"] == "cpu" and target["data"]["import_torch_seconds"] > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (runs on a GPU machine)")
def test_the_quick_check_passes_on_the_gpu(tmp_path):
    doc = _check("cuda:0", tmp_path)
    assert doc["passed"], [s for s in doc["steps"] if not s["ok"]]


def test_a_device_this_machine_lacks_is_refused_at_once(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("about a machine without CUDA")
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cuda:0", "--report", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "cuda:0 is not available here" in done.stderr


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


def test_the_triton_file_is_the_one_triton_core_picks():
    mod = _module()
    config = ('name: "m"\ndefault_model_filename: "model.pt2"\n'
              'cc_model_filenames {\n  key: "9.0"\n  value: "model.sm90.pt2"\n}\n')
    assert mod._model_file(config, "9.0") == "model.sm90.pt2"
    assert mod._model_file(config, "8.0") == "model.pt2" and mod._model_file(config, None) == "model.pt2"


def test_sample_steps_fail_when_a_sample_fails_or_sits_elsewhere():
    mod = _module()
    assert mod._samples_ok(json.dumps({"ok": False, "samples": [{"outputs": []}]}))
    assert mod._samples_ok(json.dumps({"ok": True, "samples": []}))
    assert mod._samples_ok(json.dumps({"ok": True, "samples": [{"outputs": []}]}))
    assert mod._samples_ok(json.dumps({"ok": True, "samples": [{"outputs": [{"ok": True, "max_abs": 0.0}]}]})) is None
    assert mod._samples_on(json.dumps({"samples": [{"device": "cpu"}]}), "cuda")
    assert mod._samples_on(json.dumps({"samples": [{"device": "cuda"}]}), "cuda") is None
