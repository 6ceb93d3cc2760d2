"""The one device value (``registry.runtime.device``) and the policies built on it: the default
device, where golden samples are computed, and the tolerances of a check across devices."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from registry.errors import UsageError
from registry.format.manifest import ProgramSpec, Sample
from registry.runtime.device import CPU, Device

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("text, expected", [
    ("cpu", Device("cpu")), ("cuda", Device("cuda")), ("cuda:0", Device("cuda", 0)), ("cuda:12", Device("cuda", 12)),
    (" CUDA:1 ", Device("cuda", 1)), ("mps", Device("mps")), ("xpu:3", Device("xpu", 3)), ("meta", Device("meta")),
    ("privateuseone:0", Device("privateuseone", 0)), ("cpu:0", Device("cpu", 0)),
])
def test_parse_reads_torch_device_strings(text, expected):
    d = Device.parse(text)
    assert d == expected and Device.parse(str(d)) == d and Device.parse(d) is d


@pytest.mark.parametrize("bad", ["", "cuda 0", "cuda:", ":0", "cuda:-1", "cuda:x", "cu-da", "cuda:0:1", "0",
                                 "cuda:999999", "a" * 40, "cuda:1e3", "cu\nda", None, 3, b"cpu"])
def test_anything_else_is_one_usage_error(bad):
    with pytest.raises(UsageError, match="invalid device"):
        Device.parse(bad)
    assert Device.try_parse(bad) is None


def test_constructing_a_bad_device_is_refused_too():
    with pytest.raises(UsageError):
        Device("CUDA")
    with pytest.raises(UsageError):
        Device("cuda", -1)
    with pytest.raises(UsageError):
        Device("cuda", True)


def test_same_as_lets_the_current_device_match_any_index():
    assert Device("cuda").same_as("cuda:1") and Device("cuda", 1).same_as("cuda")
    assert not Device("cuda", 0).same_as("cuda:1") and not Device("cuda").same_as("cpu")


def test_a_device_equals_its_text_and_hashes_like_it():
    assert Device("cuda", 0) == "cuda:0" and Device("cpu") == "cpu" and Device("cpu") != "cuda"
    assert Device("cuda") != "cuda:0" and Device("cpu") != "not a device" and Device("cpu") != 0
    assert {Device("cuda", 1): "x"}["cuda:1"] == "x"
    assert str(CPU) == "cpu" and CPU.is_cpu


def test_every_device_string_goes_through_the_one_parser():
    """No module splits or matches device strings itself (``.split(":")`` on a device, a
    ``cuda:`` regex): they parse with ``Device`` (registry/runtime/device.py)."""
    pattern = re.compile(r"(?<!\w)(device|dev|location)\b\s*(\.\s*(split|partition|rsplit)\(|(==|!=)\s*[\"'])")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted((ROOT / "registry").rglob("*.py")) if p.name != "device.py"
             for i, line in enumerate(p.read_text("utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []


def _program(**kw) -> ProgramSpec:
    from tests.unit.test_compat_rules import manifest, program

    return manifest({"p": program(**kw)}).programs["p"]


def test_exported_device_is_the_first_device_other_than_the_cpu():
    from registry.runtime.samples import exported_device

    assert exported_device(_program()) == CPU
    weights = [{"op": "weight", "arg": "w", "device": "cuda:0"}]
    assert exported_device(_program(baked_devices=weights)) == Device("cuda", 0)
    odd = [{"op": "weight", "arg": "w", "device": "not a device!"}, {"op": "weight", "arg": "v", "device": "meta"}]
    assert exported_device(_program(baked_devices=odd)) == CPU


def test_samples_of_a_gpu_export_are_computed_on_the_cpu_where_there_is_no_gpu(monkeypatch):
    from registry.runtime import samples

    prog = _program(baked_devices=[{"op": "weight", "arg": "w", "device": "cuda:0"}])
    monkeypatch.setattr(samples, "device_available", lambda d: False)
    assert samples.sample_device(prog) == CPU
    monkeypatch.setattr(samples, "device_available", lambda d: True)
    assert samples.sample_device(prog) == Device("cuda", 0)


def _sample(device, rtol=1e-4, atol=1e-5) -> Sample:
    return Sample("s", "p", "samples/p.0.safetensors", ("input.0",), ("output.0",), rtol, atol, device)


@pytest.mark.parametrize("computed, run_on, dtype, expected", [
    ("cpu", "cpu", "float32", (1e-4, 1e-5)),       # the sample's own, where no GPU is involved
    (None, "cpu", "bfloat16", (1e-4, 1e-5)),       # a bundle from before the field: the CPU
    ("cuda", "cpu", "float32", (5e-3, 5e-3)),      # TF32 convolutions, other summation orders
    ("cpu", "cuda:0", "float32", (5e-3, 5e-3)),
    ("cuda", "cuda:0", "bfloat16", (5e-2, 5e-2)),  # another GPU model picks other kernels
    ("cuda", "cpu", "float16", (1e-2, 1e-2)),
    ("cuda", "cpu", "int64", (1e-4, 1e-5)),        # integers stay exact
])
def test_the_tolerance_is_widened_wherever_a_gpu_is_involved(computed, run_on, dtype, expected):
    from registry.runtime.samples import sample_tolerance

    assert sample_tolerance(_sample(computed), run_on, dtype) == expected


def test_a_wider_tolerance_of_the_publisher_is_kept():
    from registry.runtime.samples import sample_tolerance

    assert sample_tolerance(_sample("cuda", rtol=0.1, atol=0.2), "cpu", "float32") == (0.1, 0.2)


def test_compare_outputs_uses_each_outputs_tolerance():
    import torch

    from registry.runtime.samples import compare_outputs

    e = [torch.ones(3), torch.ones(3, dtype=torch.bfloat16)]
    a = [torch.ones(3) * 1.001, torch.ones(3, dtype=torch.bfloat16) * 1.03]
    strict = compare_outputs(a, e, 1e-4, 1e-5)
    assert [r["ok"] for r in strict] == [False, False]
    wide = compare_outputs(a, e, 1e-4, 1e-5, tolerance=lambda dt: {"float32": (5e-3, 5e-3)}.get(dt, (5e-2, 5e-2)))
    assert [r["ok"] for r in wide] == [True, True] and wide[1]["rtol"] == 5e-2


def test_target_reads_the_isa_from_cpu_flags_without_compiling(monkeypatch):
    """``pt2reg target`` compiles nothing: the ISA comes from the CPU's feature flags, named as
    inductor names it, and matches what inductor's own (compiling) detection picks here."""
    from registry.runtime import torchrt

    called = []
    import torch._inductor.cpu_vec_isa as isa_mod

    monkeypatch.setattr(isa_mod.VecISA, "check_build", lambda self, code: called.append(code) or True)
    isa = torchrt.cpu_isa()
    assert called == []
    monkeypatch.undo()
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    picked = pick_vec_isa()
    assert isa == (str(picked).upper() if picked else None)


@pytest.mark.parametrize("features, expected", [
    ({"avx2": True, "avx512": True, "vnni": True, "amx_tile": True}, "AVX512 AVX512_VNNI AMX_TILE"),
    ({"avx2": True, "avx512": True, "vnni": True, "amx_tile": False}, "AVX512 AVX512_VNNI"),
    ({"avx2": True, "avx512": True, "vnni": False, "amx_tile": False}, "AVX512"),
    ({"avx2": True, "avx512": False, "vnni": False, "amx_tile": False}, "AVX2"),
    ({"avx2": False, "avx512": False, "vnni": False, "amx_tile": False}, None),
])
def test_the_widest_isa_whose_features_the_cpu_has(monkeypatch, features, expected):
    from registry.runtime import torchrt
    from registry.runtime.torchrt import devices

    monkeypatch.setattr(devices.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(devices, "_x86_features", lambda: features)
    assert torchrt.cpu_isa() == expected


def test_the_default_device_is_decided_in_one_place(monkeypatch):
    from registry.runtime import probe, torchrt

    monkeypatch.setattr(torchrt, "cuda_available", lambda: True)
    assert probe.resolve_device(None) == Device("cuda", 0) and probe.resolve_device("cpu") == CPU
    monkeypatch.setattr(torchrt, "cuda_available", lambda: False)
    assert probe.resolve_device(None) == CPU
    with pytest.raises(UsageError):
        probe.resolve_device("gpu 0")
    # the CLI and the API have no default of their own
    texts = {p: p.read_text("utf-8") for p in (ROOT / "registry").rglob("*.py")}
    deciders = [str(p.relative_to(ROOT)) for p, t in texts.items() if "cuda_available()" in t]
    assert sorted(deciders) == ["registry/runtime/probe.py", "registry/runtime/torchrt/devices.py"]
