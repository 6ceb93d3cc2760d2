"""The tree is the architecture: checks that keep it so (nothing imported, sources read)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _check_imports():
    spec = importlib.util.spec_from_file_location("check_imports", ROOT / "scripts" / "check_imports.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_no_import_cycles_and_one_way_layers():
    assert _check_imports().problems() == []


def test_checker_finds_a_cycle_and_an_upward_import():
    mod = _check_imports()
    assert mod.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert mod.cycles({"a": {"b"}, "b": set()}) == []
    assert mod.layer_of("registry.format.manifest") < mod.layer_of("registry.runtime.loader")
    assert mod.layer_of("registry.cli.views") == len(mod.LAYERS) - 1


def test_checker_reads_lazy_and_type_checking_imports(tmp_path):
    mod = _check_imports()
    pkg = tmp_path / "registry"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import b\n"
        "def f():\n    from .b import g\n")
    (pkg / "sub" / "b.py").write_text("from .a import f\n")
    old = mod.ROOT
    try:
        mod.ROOT = tmp_path
        modules = {"registry", "registry.sub", "registry.sub.a", "registry.sub.b"}
        top, every = mod.imports_of(pkg / "sub" / "a.py", modules)
    finally:
        mod.ROOT = old
    assert top == set() and every == {"registry.sub.b"}


def test_top_level_holds_at_most_ten_modules():
    top = sorted(p.name for p in (ROOT / "registry").glob("*.py"))
    assert len(top) <= 8, top


def test_manifest_json_is_read_only_by_the_manifest_module():
    """Every layer reads the typed manifest (attributes); its JSON is indexed only in
    registry/format/manifest.py, where it is parsed and written."""
    import re

    # an attribute ``x.raw`` (not a media type string like "...weight.v1.raw" or ``.raw`` in prose)
    pattern = re.compile(r"[\w)\]]\.raw\b(?![\"`])|to_json\(\)\s*\[|to_json\(\)\.get\(")
    found = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
             for p in sorted((ROOT / "registry").rglob("*.py")) if p != ROOT / "registry/format/manifest.py"
             for i, line in enumerate(p.read_text("utf-8").splitlines(), 1) if pattern.search(line)]
    assert found == []
    from registry.format.manifest import Manifest

    assert not hasattr(Manifest, "raw")


def test_data_beside_the_package_is_found_from_one_place():
    """``schema/`` and ``migrations/`` (a checkout run without installing) and the sandbox
    child's ``PYTHONPATH`` are all found from ``PACKAGE_PARENT``, never by counting ``parents``
    of a module's own path (moving modules into packages broke two such counts once)."""
    import re

    from registry.constants import PACKAGE_PARENT
    from registry.format.manifest import load_schema

    assert PACKAGE_PARENT == ROOT and (PACKAGE_PARENT / "registry" / "__init__.py").is_file()
    assert (PACKAGE_PARENT / "schema" / "manifest.schema.json").is_file()
    assert (PACKAGE_PARENT / "migrations" / "env.py").is_file()
    assert load_schema()["properties"]
    counted = [f"{p.relative_to(ROOT)}:{i}" for p in sorted((ROOT / "registry").rglob("*.py"))
               if p != ROOT / "registry" / "constants.py"
               for i, line in enumerate(p.read_text("utf-8").splitlines(), 1)
               if re.search(r"__file__\)?[.\w()]*\.(parents\[|parent\.parent)", line)]
    assert counted == []
