"""Variant choice when native code is not allowed (issue 14 item 3): pure rules, no torch."""
from __future__ import annotations

from registry.runtime.compat import NATIVE_FIX, check, choose_variant
from tests.unit.test_compat_rules import CPU, CUDA, aoti, codes, manifest, program


def test_a_matching_aoti_variant_is_passed_over_for_the_portable_program_with_an_info_finding():
    m = manifest({"p": program(variants=(aoti(),))})
    assert check(m, CPU).choices["p"][0] == "aoti-cpu-x86_64"          # the rule itself is unchanged
    report = check(m, CPU, allow_native=False)
    vid, why = report.choices["p"]
    assert vid == "portable" and "aoti-cpu-x86_64 matches the target but is native code" in why
    assert report.compatible and codes(report.findings) == [("info", "native-code")]
    (f,) = report.findings
    assert f.program == "p" and "'aoti-cpu-x86_64'" in f.message and f.fix == NATIVE_FIX
    assert report.errors == [] and report.warnings == []
    assert choose_variant(m.programs["p"], CPU, allow_native=False)[0].id == "portable"


def test_a_non_matching_aoti_variant_says_nothing_about_native_code():
    m = manifest({"p": program(variants=(aoti(),))})
    report = check(m, CUDA, allow_native=False)
    assert report.choices["p"][0] == "portable" and report.findings == ()


def test_only_aoti_variants_without_trust_is_a_native_code_error_not_aoti_target():
    m = manifest({"p": program(portable=False, variants=(aoti(),))})
    report = check(m, CPU, allow_native=False)
    assert not report.compatible and codes(report.findings) == [("error", "native-code")]
    assert "has only AOTInductor variants (native code)" in report.findings[0].message
    assert report.choices["p"][0] is None
    assert check(m, CPU).compatible  # allowed: it runs
    # one that would not match anyway stays an aoti-target (exit 4) problem
    report = check(m, CUDA, allow_native=False)
    assert codes(report.findings) == [("error", "aoti-target")]
