"""Issue 45: what `pt2reg list`, `show`, `push` and `pull` import on a local store (SQLite + a
directory), read from ``sys.modules`` of a real ``pt2reg`` process at its exit. No timing here:
the cost of these imports is measured in benchmarks/bench_cli.py.

A module in ``FORBIDDEN`` imported by one of these commands is a regression of the fixed cost
every user pays (torch alone is seconds; the server stack, boto3, Alembic tens to hundreds of
milliseconds), whatever the import path that brought it in."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures_pt2 import ROOT

BUNDLE = ROOT / "tests" / "data" / "format1" / "mlp.pt2b"  # committed: no torch needed to make it

#: never for local work: torch and numpy, the server and its web stack, the S3 stack, the remote
#: client, Alembic (a database at head is recognised without it), PostgreSQL's dialect and
#: driver, cryptography (nothing here is signed)
FORBIDDEN = ("torch", "numpy", "registry.runtime", "registry.serving", "registry.server", "fastapi", "starlette",
             "uvicorn", "jinja2", "boto3", "botocore", "s3transfer", "registry.blobs.s3", "registry.remote", "httpx",
             "alembic", "sqlalchemy.dialects.postgresql", "psycopg", "cryptography", "nacl")
#: list and show read rows: no bundle format, no blob store, no manifest validation
FORBIDDEN_FOR_READS = FORBIDDEN + ("jsonschema", "registry.format.bundle", "registry.format.manifest",
                                   "registry.blobs", "registry.client.sources", "registry.client.push",
                                   "registry.client.pull", "registry.client.upload",
                                   "registry.client.fetch")

#: the child: record every module imported, at exit, after the command ran as `pt2reg` runs it
CHILD = """
import atexit, json, os, sys
atexit.register(lambda: open(os.environ["PT2REG_TEST_MODULES"], "w").write(json.dumps(sorted(sys.modules))))
from registry.cli import main
main(sys.argv[1:])
"""


def imported_by(tmp_path: Path, home: Path, *args: str) -> set[str]:
    out = tmp_path / "modules.json"
    out.unlink(missing_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PT2REG_")}
    env.update(PT2REG_HOME=str(home), PT2REG_TEST_MODULES=str(out),
               PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "-c", CHILD, *args], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return set(json.loads(out.read_text()))


def loaded(modules: set[str], prefixes: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(p + ".") for p in prefixes))


@pytest.fixture(scope="module")
def home(tmp_path_factory) -> Path:
    """A local registry holding the committed bundle as bench@1, alias prod."""
    tmp = tmp_path_factory.mktemp("imports")
    imported_by(tmp, tmp / "home", "push", str(BUNDLE), "--name", "bench", "--alias", "prod")
    return tmp / "home"


@pytest.mark.parametrize("args", [("list",), ("list", "bench"), ("show", "bench@prod")], ids=" ".join)
def test_reading_commands_import_neither_torch_nor_the_bundle_machinery(tmp_path, home, args):
    modules = imported_by(tmp_path, home, *args)
    assert "registry.store.sql" in modules and "sqlalchemy.orm" in modules  # the rows were read here
    assert loaded(modules, FORBIDDEN_FOR_READS) == []


def test_push_and_pull_import_neither_torch_nor_the_server_or_s3_stack(tmp_path, home):
    pushed = imported_by(tmp_path, home, "push", str(BUNDLE), "--name", "bench")  # exists: no upload
    assert "registry.client.push" in pushed and "registry.format.bundle" in pushed
    assert loaded(pushed, FORBIDDEN) == []
    pulled = imported_by(tmp_path, home, "pull", "bench@1", "-o", str(tmp_path / "out.pt2b"))
    assert (tmp_path / "out.pt2b").is_file() and "registry.client.pull" in pulled
    assert loaded(pulled, FORBIDDEN) == []


def test_a_cold_pull_from_an_empty_cache_imports_no_more(tmp_path, home):
    """The first pull on a machine fetches and verifies every blob: still none of the above."""
    shutil.rmtree(home / "cache", ignore_errors=True)
    pulled = imported_by(tmp_path, home, "pull", "bench@prod", "-o", str(tmp_path / "cold.pt2b"))
    assert (tmp_path / "cold.pt2b").stat().st_size > 0
    assert loaded(pulled, FORBIDDEN) == []


def test_the_check_sees_a_forbidden_module():
    """The guard itself: a module the command did import is found under its prefix."""
    assert loaded({"torch._C", "sqlalchemy.dialects.postgresql.base", "registry.store"}, FORBIDDEN) == \
        ["sqlalchemy.dialects.postgresql.base", "torch._C"]


def _digest(path: Path) -> str:
    from registry.format.bundle import BundleFile

    return BundleFile.open(path).digest


def test_a_bundle_of_known_operators_does_not_import_torch(tmp_path, pt2_dir):
    """The first bundle with this torch imports it once for the schemas of the program's operators
    and remembers them (cache/op-schemas, keyed by the torch installation); the next bundle of
    programs calling those operators needs no torch at all, and writes the same bytes. A custom
    op's schema is never remembered: that program imports torch each time."""
    home = tmp_path / "home"
    first = imported_by(tmp_path, home, "bundle", str(pt2_dir / "decoder.pt2"), "-o", str(tmp_path / "a.pt2b"))
    assert "torch" in first
    memo = list((home / "cache" / "op-schemas").glob("*.json"))
    assert len(memo) == 1 and all(k.startswith("torch.ops.aten.") for k in json.loads(memo[0].read_text()))
    again = imported_by(tmp_path, home, "bundle", str(pt2_dir / "decoder.pt2"), "-o", str(tmp_path / "b.pt2b"))
    assert loaded(again, ("torch", "numpy")) == []
    assert _digest(tmp_path / "a.pt2b") == _digest(tmp_path / "b.pt2b")   # the same manifest, schemas included

    memo[0].write_text("{not json")   # damaged: asked of torch again, and rewritten
    imported_by(tmp_path, home, "bundle", str(pt2_dir / "decoder.pt2"), "-o", str(tmp_path / "c.pt2b"))
    assert json.loads(memo[0].read_text()) and _digest(tmp_path / "c.pt2b") == _digest(tmp_path / "a.pt2b")

    custom = imported_by(tmp_path, home, "bundle", "--import", "tests.make_models", str(pt2_dir / "custom_op.pt2"),
                         "-o", str(tmp_path / "d.pt2b"))
    assert "torch" in custom
    assert not any(k.split(".")[2] == "pt2reg_test" for k in json.loads(memo[0].read_text()))
