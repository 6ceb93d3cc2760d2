"""Every compatibility rule on manifests built as plain dicts: no torch, no deserialization."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from registry.format.manifest import Manifest
from registry.runtime.compat import RULES, CompatReport, Finding, check, choose_variant
from registry.runtime.target import OpInfo, Target

ROOT = Path(__file__).resolve().parents[2]
CPU = Target("2.13.0+cpu", (8, 20), "cpu", platform="linux", machine="x86_64", cpu_isa="AVX512 AVX512_VNNI")
CUDA = Target("2.13.0+cu128", (8, 20), "cuda", (9, 0), cuda_version="12.8", platform="linux", machine="x86_64")
OP_SCHEMA = "mylib::myop(Tensor x, float alpha) -> Tensor"


def aoti(device_key="cpu", cc=None, platform="linux", machine="x86_64", cpu_isa="AVX512", vid=None) -> dict:
    vid = vid or f"aoti-{device_key}-{cc or machine}".lower()
    return {"id": vid, "kind": "aoti", "member": f"programs/p.{vid}.pt2", "archive_name": "model",
            "target": {"device_key": device_key, "compute_capability": cc, "platform": platform,
                       "machine": machine, "cpu_isa": cpu_isa}}


def program(*, portable: bool = True, variants: tuple[dict, ...] = (), **fields: Any) -> dict:
    prog = {
        "variants": ([{"id": "portable", "kind": "exported_program", "member": "programs/p.pt2",
                       "archive_name": "model"}] if portable else []) + list(variants),
        "inputs": [], "outputs": [], "range_constraints": [], "required_ops": [], "torchbind_classes": [],
        "baked_devices": [], "dtypes": ["float32"],
        "serialization": {"torch_version": "2.13.0+cpu", "schema_version": [8, 20],
                          "opset_version": {"aten": 10}, "archive_version": "0"},
    }
    prog.update(fields)
    return prog


def manifest(programs: dict[str, dict] | None = None, **requirements: Any) -> Manifest:
    programs = programs if programs is not None else {"p": program()}
    members = {}
    for prog in programs.values():
        for v in prog["variants"]:
            role = "program" if v["kind"] == "exported_program" else "aoti"
            members[v["member"]] = {"path": v["member"], "sha256": "0" * 64, "size": 1, "role": role}
    return Manifest.from_raw({
        "format": 1, "kind": "pt2-bundle", "programs": programs,
        "members": [members[k] for k in sorted(members)], "samples": [],
        "requirements": {"torch": ">=2.13", "device_types": None, "hardware_dtypes": [], **requirements},
        "metadata": {}, "environment": {"python": "3.11.7", "torch": "2.13.0+cpu", "platform": "linux-x86_64"},
    })


def codes(findings: list[Finding] | tuple[Finding, ...]) -> list[tuple[str, str]]:
    return [(f.severity, f.code) for f in findings]


def with_op(schema: str | None = OP_SCHEMA, keys: tuple[str, ...] = ("CPU",), base: Target = CUDA) -> Target:
    return Target(base.torch_version, base.serde_schema, base.device_type, base.compute_capability,
                  platform=base.platform, machine=base.machine, cpu_isa=base.cpu_isa,
                  custom_ops={"mylib::myop": OpInfo(schema, keys)})


def op_program(schema: str | None = OP_SCHEMA, overload: str = "default") -> dict:
    return program(required_ops=[{"name": "mylib::myop", "overload": overload,
                                  "target": f"torch.ops.mylib.myop.{overload}", "schema": schema}])


# ---------------------------------------------------------------------------------- baseline

def test_plain_bundle_is_compatible_everywhere():
    for target in (CPU, CUDA):
        report = check(manifest(), target)
        assert report.compatible and report.findings == ()
        assert report.choices["p"][0] == "portable"


def test_every_rule_is_silent_on_a_plain_bundle():
    m = manifest()
    assert all(rule(m, CPU, None) == [] for rule in RULES)


@pytest.mark.parametrize("allow_native", [True, False])
def test_variant_chosen_once_per_program_and_handed_to_the_rules(monkeypatch, allow_native):
    """``check`` chooses each program's variant once; the rules read that choice."""
    from registry.runtime import compat

    calls = []
    choose = compat._choose
    monkeypatch.setattr(compat, "_choose", lambda prog, *a: calls.append(prog.name) or choose(prog, *a))
    m = manifest({"p": program(variants=(aoti(),), baked_devices=[{"op": "weight", "arg": "w", "device": "cuda:0"}]),
                  "q": program(portable=False, variants=(aoti(vid="aoti-b"),))})
    report = check(m, CPU, allow_native=allow_native)
    assert sorted(calls) == ["p", "q"]
    assert report.variants["p"].variant.id == ("aoti-cpu-x86_64" if allow_native else "portable")
    assert ("native-code" in {f.code for f in report.findings}) is not allow_native


def test_rules_import_no_torch():
    code = ("import sys, registry.runtime.compat, registry.runtime.inputs, registry.runtime.target; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr


# ---------------------------------------------------------------------------------- serde

def test_serde_major_mismatch_is_an_error_naming_both_versions():
    t = Target("2.20.0", (9, 0), "cpu")
    report = check(manifest(), t)
    (f,) = report.findings
    assert (f.severity, f.code, f.program) == ("error", "serde-schema", "p")
    assert "serde schema 8.20" in f.message and "reads schema 9.x" in f.message
    assert "torch" in f.fix and not report.compatible


def test_serde_major_mismatch_only_warns_when_an_aoti_variant_is_chosen():
    t = Target("2.20.0", (9, 0), "cpu", platform="linux", machine="x86_64", cpu_isa="AVX512")
    report = check(manifest({"p": program(variants=(aoti(),))}), t)
    assert codes(report.findings) == [("warning", "serde-schema")]
    assert report.compatible and report.choices["p"][0] == "aoti-cpu-x86_64"


def test_newer_serde_minor_is_a_warning_older_is_fine():
    newer = program(serialization={"torch_version": "2.14.0", "schema_version": [8, 25], "opset_version": {},
                                   "archive_version": "0"})
    assert codes(check(manifest({"p": newer}, torch=None), CPU).findings) == [("warning", "serde-minor")]
    older = program(serialization={"torch_version": "2.10.0", "schema_version": [8, 3], "opset_version": {}})
    assert check(manifest({"p": older}, torch=None), CPU).findings == ()


def test_unknown_archive_version_is_an_error():
    prog = program(serialization={"torch_version": "2.13.0", "schema_version": [8, 20], "opset_version": {},
                                  "archive_version": "1"})
    assert codes(check(manifest({"p": prog}), CPU).findings) == [("error", "archive-version")]


# ---------------------------------------------------------------------------------- torch version

@pytest.mark.parametrize("spec, version, expected", [
    (">=2.13", "2.13.0+cpu", []),
    (">=2.13", "2.14.0a0+git1234", []),          # nightlies are what the target really runs
    (">=2.14", "2.13.0+cpu", [("error", "torch-version")]),
    (">=2.10,<2.13", "2.13.1", [("error", "torch-version")]),
    (None, "1.0.0", []),
    ("not a spec", "2.13.0", [("warning", "torch-version")]),
    (">=2.13", "weird-build", [("warning", "torch-version")]),
])
def test_torch_requirement(spec, version, expected):
    t = Target(version, (8, 20), "cpu")
    assert codes(check(manifest(torch=spec), t).findings) == expected


def test_torch_requirement_message_names_version_and_spec():
    (f,) = check(manifest(torch=">=2.14"), CPU).findings
    assert f.message == "torch 2.13.0+cpu does not satisfy the bundle's requirement '>=2.14'"


# ---------------------------------------------------------------------------------- device type

def test_device_type_not_supported_by_the_bundle():
    (f,) = check(manifest(device_types=["cpu"]), CUDA).findings
    assert (f.severity, f.code) == ("error", "device-type") and "not cuda" in f.message


def test_requested_device_must_be_the_targets():
    (f,) = check(manifest(), CPU, "cuda:0").findings
    assert f.code == "device-type" and "requested device cuda:0" in f.message


def test_min_compute_capability():
    t = Target("2.13.0", (8, 20), "cuda", (7, 5))
    (f,) = check(manifest(min_compute_capability=[8, 0]), t).findings
    assert f.code == "compute-capability" and ">= 8.0" in f.message and "7.5" in f.message
    assert check(manifest(min_compute_capability=[8, 0]), CUDA).findings == ()


# ---------------------------------------------------------------------------------- hardware dtypes

@pytest.mark.parametrize("dtype, device, cc, rocm, expected", [
    ("bfloat16", "cuda", (7, 5), None, ("error", "hw-dtype")),
    ("bfloat16", "cuda", (8, 0), None, None),
    ("float8_e4m3fn", "cuda", (8, 6), None, ("error", "hw-dtype")),
    ("float8_e4m3fn", "cuda", (8, 9), None, None),
    ("float8_e5m2", "cuda", (9, 0), None, None),
    ("float8_e4m3fnuz", "cuda", (9, 0), None, ("error", "hw-dtype")),
    ("bfloat16", "cuda", None, None, ("warning", "hw-dtype")),
    ("bfloat16", "cuda", None, "6.2", None),
    ("float8_e4m3fnuz", "cuda", None, "6.2", ("warning", "hw-dtype")),
    ("bfloat16", "cpu", None, None, None),
    ("float8_e4m3fn", "cpu", None, None, ("warning", "hw-dtype")),
])
def test_hardware_dtypes(dtype, device, cc, rocm, expected):
    t = Target("2.13.0", (8, 20), device, cc, rocm_version=rocm)
    m = manifest({"p": program(dtypes=["float32", dtype])}, hardware_dtypes=[dtype])
    assert codes(check(m, t).findings) == ([expected] if expected else [])


def test_bf16_message_names_dtype_and_capabilities():
    t = Target("2.13.0", (8, 20), "cuda", (7, 5))
    (f,) = check(manifest({"p": program(dtypes=["bfloat16"])}), t).findings
    assert "uses bfloat16" in f.message and ">= 8.0" in f.message and "7.5" in f.message


# ---------------------------------------------------------------------------------- custom ops

def test_missing_custom_op_is_named_with_a_fix():
    (f,) = check(manifest({"p": op_program()}), CPU).findings
    assert (f.severity, f.code, f.program) == ("error", "custom-op-missing", "p")
    assert "mylib::myop" in f.message and "--import" in f.fix


def test_registered_op_with_a_kernel_for_the_device_passes():
    assert check(manifest({"p": op_program()}), with_op(base=CPU)).findings == ()


def test_op_with_only_a_cpu_kernel_on_a_cuda_target():
    (f,) = check(manifest({"p": op_program()}), with_op(keys=("CPU", "Meta"))).findings
    assert (f.severity, f.code) == ("error", "custom-op-kernel")
    assert f.message == "custom op mylib::myop has no CUDA kernel on the target (kernels: CPU, Meta)"


@pytest.mark.parametrize("key", ["CompositeImplicitAutograd", "CompositeExplicitAutograd", "CUDA"])
def test_composite_kernels_serve_every_device(key):
    assert check(manifest({"p": op_program()}), with_op(keys=(key,))).findings == ()


def test_schema_mismatch_is_an_error_whitespace_is_not():
    other = "mylib::myop(Tensor x, int alpha) -> Tensor"
    (f,) = check(manifest({"p": op_program()}), with_op(schema=other, keys=("CUDA",))).findings
    assert f.code == "custom-op-schema" and "int alpha" in f.message and "float alpha" in f.message
    spaced = "mylib::myop(Tensor x,  float alpha)  -> Tensor"
    assert check(manifest({"p": op_program()}), with_op(schema=spaced, keys=("CUDA",))).findings == ()


def test_unknown_schema_on_either_side_is_not_compared():
    assert check(manifest({"p": op_program(schema=None)}), with_op(schema="x", keys=("CUDA",))).findings == ()
    assert check(manifest({"p": op_program()}), with_op(schema=None, keys=("CUDA",))).findings == ()


def test_overloads_use_the_dispatcher_name():
    m = manifest({"p": op_program(overload="out")})
    (f,) = check(m, with_op(keys=("CUDA",))).findings
    assert "mylib::myop.out" in f.message
    t = Target("2.13.0", (8, 20), "cuda", (9, 0), custom_ops={"mylib::myop.out": OpInfo(None, ("CUDA",))})
    assert check(m, t).findings == ()


# ---------------------------------------------------------------------------------- torchbind

def test_torchbind_class_must_be_registered():
    m = manifest({"p": program(torchbind_classes=["__torch__.torch.classes.mylib.Cache"])})
    (f,) = check(m, CPU).findings
    assert (f.severity, f.code) == ("error", "torchbind") and "mylib.Cache" in f.message
    for name in ("__torch__.torch.classes.mylib.Cache", "torch.classes.mylib.Cache"):
        t = Target("2.13.0", (8, 20), "cpu", torchbind_classes=(name,))
        assert check(m, t).findings == ()


# ---------------------------------------------------------------------------------- AOTI variants

def test_exactly_matching_aoti_variant_is_chosen():
    m = manifest({"p": program(variants=(aoti(cpu_isa="AVX512 AVX512_VNNI"),))})
    report = check(m, CPU)
    vid, why = report.choices["p"]
    assert vid == "aoti-cpu-x86_64" and "matches the target" in why and report.findings == ()


@pytest.mark.parametrize("variant, target, words", [
    (aoti(), CUDA, "built for cpu, the target device is cuda"),
    (aoti("cuda", "90"), Target("2.13.0", (8, 20), "cuda", (8, 0), platform="linux", machine="x86_64"),
     "built for sm_90, the target is sm_80"),
    (aoti("cuda", "90"), Target("2.13.0", (8, 20), "cuda", None), "unknown compute capability"),
    (aoti(machine="aarch64"), CPU, "built for machine aarch64, the target's is x86_64"),
    (aoti(platform="darwin"), CPU, "built for platform darwin"),
    (aoti(cpu_isa="AVX512 AVX512_VNNI AMX_TILE"), CPU, "the target lacks AMX_TILE"),
    (aoti(), Target("2.13.0", (8, 20), "cpu", platform="linux", machine="x86_64"), "CPU ISA is unknown"),
])
def test_mismatching_aoti_variant_falls_back_to_portable_with_reason(variant, target, words):
    m = manifest({"p": program(variants=(variant,))})
    report = check(m, target)
    vid, why = report.choices["p"]
    assert vid == "portable" and words in why and variant["id"] in why
    assert report.compatible


def test_isa_implications_and_no_vectorization():
    for isa in ("AVX2", "INVALID_VEC_ISA", None):
        m = manifest({"p": program(variants=(aoti(cpu_isa=isa),))})
        assert check(m, CPU).choices["p"][0] == "aoti-cpu-x86_64"


def test_the_matching_one_of_several_aoti_variants_wins():
    m = manifest({"p": program(variants=(aoti("cuda", "80"), aoti("cuda", "90")))})
    assert check(m, CUDA).choices["p"][0] == "aoti-cuda-90"
    assert choose_variant(m.programs["p"], CUDA, "cuda:1")[0].id == "aoti-cuda-90"


def test_only_aoti_variants_and_none_matches_is_an_error():
    m = manifest({"p": program(portable=False, variants=(aoti("cuda", "90"),))})
    t = Target("2.13.0", (8, 20), "cuda", (8, 6))
    report = check(m, t)
    assert codes(report.findings) == [("error", "aoti-target")]
    assert "sm_90" in report.findings[0].message and report.choices["p"][0] is None
    assert not report.compatible


# ---------------------------------------------------------------------------------- baked devices

BAKED = {"op": "torch.ops.aten.arange.default", "arg": "device", "device": "cpu",
         "source": "/src/model.py:12", "code": 'pos = torch.arange(n, device="cpu")'}


def test_baked_cpu_on_cuda_target_warns_with_source_line():
    (f,) = check(manifest({"p": program(baked_devices=[BAKED])}), CUDA, "cuda:0").findings
    assert (f.severity, f.code) == ("warning", "baked-device")
    assert "/src/model.py:12" in f.message and "will be moved to cuda:0" in f.message
    assert "move_to_device_pass" in f.why


def test_baked_device_equal_to_target_is_silent():
    assert check(manifest({"p": program(baked_devices=[BAKED])}), CPU).findings == ()
    cuda0 = {**BAKED, "device": "cuda:0"}
    assert check(manifest({"p": program(baked_devices=[cuda0])}), CUDA, "cuda").findings == ()
    (f,) = check(manifest({"p": program(baked_devices=[cuda0])}), CUDA, "cuda:1").findings
    assert "will be moved to cuda:1" in f.message


def test_baked_device_with_only_a_foreign_aoti_variant_is_an_error():
    m = manifest({"p": program(portable=False, variants=(aoti(),), baked_devices=[BAKED])})
    report = check(m, CUDA)
    assert ("error", "baked-device") in codes(report.findings)
    assert "cannot be moved" in next(f.message for f in report.findings if f.code == "baked-device")


def test_baked_device_under_a_chosen_aoti_variant_warns():
    m = manifest({"p": program(variants=(aoti("cuda", "90", cpu_isa=None),), baked_devices=[BAKED])})
    (f,) = check(m, CUDA).findings
    assert f.severity == "warning" and "AOTInductor variant aoti-cuda-90" in f.message


# ---------------------------------------------------------------------------------- the report

def test_report_collects_every_finding_at_once_and_serializes():
    prog = op_program()
    prog.update(dtypes=["bfloat16"], baked_devices=[BAKED])
    t = Target("2.12.0", (9, 0), "cuda", (7, 5))
    report = check(manifest({"p": prog}, torch=">=2.13", device_types=["cpu"]), t)
    assert isinstance(report, CompatReport) and not report.compatible
    assert {c for _, c in codes(report.findings)} == {
        "serde-schema", "torch-version", "device-type", "hw-dtype", "custom-op-missing", "baked-device"}
    doc = report.to_json()
    assert doc["compatible"] is False and doc["variants"]["p"]["id"] == "portable"
    assert set(doc["findings"][0]) == {"severity", "code", "program", "message", "why", "fix"}
    assert all("\n" not in f.message for f in report.findings)
    assert len(report.errors) + len(report.warnings) == len(report.findings)


# ------------------------------------------------------------- issue 42: windows and operators

def windowed(torch: str = "2.10", schema: tuple[int, int] = (8, 15), features: tuple[str, ...] = (),
             **fields: Any) -> dict:
    """A program written by torch 2.13 (schema 8.20) whose window is ``torch``/``schema``."""
    prog = program(**fields)
    prog["serialization"]["window"] = {"torch": torch, "schema": list(schema), "features": list(features)}
    return prog


T211 = Target("2.11.0+cu130", (8, 17), "cpu", platform="linux", machine="x86_64")


def test_a_window_older_than_the_writer_admits_an_older_torch():
    """Written by 2.13 (schema 8.20) but using nothing newer than 2.10's: 2.11 (8.17) reads it."""
    report = check(manifest({"p": windowed()}, torch=">=2.10"), T211)
    assert report.compatible and report.findings == ()


def test_a_window_newer_than_the_target_is_exit_4_naming_both_torches():
    m = manifest({"p": windowed("2.12", (8, 20), ("ScalarType.UINT32 (torch 2.12)",))}, torch=">=2.12")
    report = check(m, T211)
    assert ("error", "serde-schema") in codes(report.findings)
    f = next(f for f in report.findings if f.code == "serde-schema")
    assert "needs torch >= 2.12" in f.message and "ScalarType.UINT32" in f.message
    assert "2.11.0+cu130 reads up to schema 8.17" in f.message
    assert "torch >= 2.12" in f.fix and "re-export" in f.fix
    # the requirement's fix does not suggest lowering it: the window excludes 2.11 anyway
    req = next(f for f in report.findings if f.code == "torch-version")
    assert "--torch-requirement" not in req.fix


def test_a_requirement_the_window_would_allow_names_torch_requirement():
    """Bundles made before windows were recorded required the exporter's torch: the fix says
    how to rebuild one whose programs an older torch reads."""
    report = check(manifest({"p": windowed()}, torch=">=2.13"), T211)
    assert codes(report.findings) == [("error", "torch-version")]
    assert "--torch-requirement '>=2.11'" in report.findings[0].fix


def test_a_bundle_without_a_window_falls_back_to_the_writers_schema_as_a_warning():
    report = check(manifest(torch=">=2.10"), T211)
    assert codes(report.findings) == [("warning", "serde-minor")]
    assert "re-bundle" in report.findings[0].fix


def _op(name: str, overload: str, schema: str) -> dict:
    ns, op = name.split("::")
    return {"name": name, "overload": overload, "target": f"torch.ops.{ns}.{op}.{overload}", "schema": schema}


ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


def _with_schemas(base: Target, schemas: dict[str, str]) -> Target:
    from dataclasses import replace

    from registry.runtime.target import schema_digest

    return replace(base, op_schemas={k: schema_digest(v) for k, v in schemas.items()})


def test_operators_are_checked_against_the_targets_registry():
    prog = windowed(operators=[_op("aten::add", "Tensor", ADD)])
    same = _with_schemas(T211, {"aten::add.Tensor": "  " + ADD.replace(", ", " ,  ").replace(" ,  ", ", ")})
    assert check(manifest({"p": prog}, torch=">=2.10"), same).compatible
    missing = _with_schemas(T211, {"aten::mul.Tensor": ADD})
    report = check(manifest({"p": prog}, torch=">=2.10"), missing)
    assert codes(report.findings) == [("error", "operator-missing")]
    assert "aten::add.Tensor" in report.findings[0].message and "2.11.0+cu130" in report.findings[0].message
    changed = _with_schemas(T211, {"aten::add.Tensor": ADD.replace("alpha=1", "alpha=1, bool fast=False")})
    report = check(manifest({"p": prog}, torch=">=2.10"), changed)
    assert codes(report.findings) == [("error", "operator-schema")]
    assert "matched by name" in report.findings[0].why


def test_operators_are_not_checked_against_a_target_that_records_none():
    prog = windowed(operators=[_op("aten::add", "Tensor", ADD)])
    assert check(manifest({"p": prog}, torch=">=2.10"), T211).compatible


def test_operators_do_not_matter_when_an_aoti_variant_is_chosen():
    prog = windowed(operators=[_op("aten::add", "Tensor", ADD)], variants=(aoti(cpu_isa=None),))
    report = check(manifest({"p": prog}, torch=">=2.10"), _with_schemas(T211, {"aten::mul.Tensor": ADD}))
    assert report.choices["p"][0] == "aoti-cpu-x86_64" and report.compatible


@pytest.mark.parametrize("built, abi, words", [
    ("2.12.0+cpu", None, "compiled by torch 2.12.0+cpu, the target runs torch 2.11.0+cu130"),
    ("2.11.0", False, "pre-C++11 libstdc++ ABI"),
])
def test_aoti_variants_run_only_on_the_torch_and_abi_that_compiled_them(built, abi, words):
    from dataclasses import replace

    variant = aoti(cpu_isa=None)
    variant["target"].update(torch_version=built, cxx11_abi=abi)
    target = replace(T211, cxx11_abi=True)
    m = manifest({"p": windowed(variants=(variant,))}, torch=">=2.10")
    report = check(m, target)
    assert report.choices["p"][0] == "portable" and words in report.choices["p"][1]
    only = manifest({"p": windowed(portable=False, variants=(variant,))}, torch=">=2.10")
    assert ("error", "aoti-target") in codes(check(only, target).findings)
    variant["target"].update(torch_version="2.11.1", cxx11_abi=True)   # same major.minor, same ABI
    assert check(manifest({"p": windowed(variants=(variant,))}, torch=">=2.10"), target).choices["p"][0] != "portable"


def test_release_matrix_answers_per_supported_torch_from_the_manifest():
    from registry.runtime.compat import release_matrix

    m = manifest({"a": windowed(), "b": windowed("2.12", (8, 20), ("Argument.as_float_lists (torch 2.12)",))},
                 torch=">=2.10")
    verdicts = {v.release: v for v in release_matrix(m)}
    assert [r for r, v in verdicts.items() if v.ok] == ["2.12", "2.13", "2.14"]
    assert "program 'b' needs torch >= 2.12" in verdicts["2.11"].reason
    pinned = {v.release: v.ok for v in release_matrix(manifest({"a": windowed()}, torch=">=2.13"))}
    assert pinned == {"2.10": False, "2.11": False, "2.12": False, "2.13": True, "2.14": True}
