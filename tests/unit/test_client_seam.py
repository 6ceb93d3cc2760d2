"""The client seam: Registry over the MetadataStore/BlobStore protocols, close() and ``with``,
one ``open_source`` for "a bundle file or a ref", a ref resolved once per command, and the
exit-code policy of a compatibility report in ``CompatReport.raise_for_status``."""
from __future__ import annotations

import inspect
import json

import pytest

from registry.client import BlobStore, MetadataStore, Registry
from registry.client.sources import MaterializedBundle, open_source, parse_source
from registry.config import Settings
from registry.errors import IncompatibleError, NotFoundError, UnsafeArchiveError, UsageError
from registry.runtime.compat import CompatReport, Finding
from registry.store import SqlMetadataStore
from tests.cli_inprocess import invoker


@pytest.fixture
def settings(tmp_path, monkeypatch):
    monkeypatch.delenv("PT2REG_TRUST", raising=False)
    return Settings.resolve(home=str(tmp_path / "home"), env={})


@pytest.fixture
def closes(monkeypatch):
    """Counts SqlMetadataStore.close calls (each disposes the store's engine)."""
    calls: list[int] = []
    real = SqlMetadataStore.close

    def close(self):
        calls.append(id(self))
        real(self)

    monkeypatch.setattr(SqlMetadataStore, "close", close)
    return calls


@pytest.fixture
def resolves(monkeypatch):
    """Counts the metadata store's ref resolutions."""
    calls: list[str] = []
    real = SqlMetadataStore.resolve

    def resolve(self, ref):
        calls.append(str(ref))
        return real(self, ref)

    monkeypatch.setattr(SqlMetadataStore, "resolve", resolve)
    return calls


# -- the typed seam ----------------------------------------------------------------------------

def test_the_sql_store_and_local_blobs_satisfy_the_protocols_a_remote_client_will_fill(settings):
    """Every MetadataStore method exists on SqlMetadataStore and takes the protocol's arguments."""
    from registry.blobs import LocalBlobStore

    with Registry(settings) as reg:
        assert isinstance(reg.meta, MetadataStore) and isinstance(reg.blobs, BlobStore)
    assert isinstance(LocalBlobStore(str(settings.home / "b")), BlobStore)
    from registry.remote.meta import HttpMetadataStore

    # MetadataStore is a composite of one port per concern: its methods are those of the ports
    ports = [p for p in MetadataStore.__mro__ if p.__module__ == "registry.client.ports"]
    wanted = sorted({n for p in ports for n, v in vars(p).items() if callable(v) and not n.startswith("_")})
    assert len(ports) >= 7 and len(wanted) > 20
    for impl_class in (SqlMetadataStore, HttpMetadataStore):
        for name in wanted:
            proto = inspect.signature(getattr(MetadataStore, name)).parameters
            impl = inspect.signature(getattr(impl_class, name)).parameters
            missing = [p for p in proto if p not in impl]
            assert not missing, f"{impl_class.__name__}.{name} lacks {missing}"
        assert isinstance(impl_class.extends_claims, bool)   # capabilities are declared by the class


def test_registry_uses_the_stores_it_is_given(settings, tmp_path):
    from registry.blobs import LocalBlobStore
    from registry.store import open_metadata_store

    meta = open_metadata_store(f"sqlite:///{tmp_path / 'given.db'}", auto_create=True)
    blobs = LocalBlobStore(str(tmp_path / "given-store"))
    with Registry(settings, meta=meta, blobs=blobs) as reg:
        assert reg.meta is meta and reg.blobs is blobs
        assert reg.list_models() == []
    assert not (settings.home / "registry.db").exists()  # the settings' database was never opened


# -- close() and ``with`` ----------------------------------------------------------------------

def test_close_disposes_the_engine_once_and_a_closed_registry_refuses_work(settings, closes):
    reg = Registry(settings)
    reg.close()                     # nothing opened yet: nothing to close
    assert closes == []
    reg = Registry(settings)
    assert reg.list_models() == []
    reg.close()
    reg.close()                     # idempotent
    assert len(closes) == 1
    with pytest.raises(UsageError, match="closed"):
        reg.list_models()
    with Registry(settings) as reg:
        reg.list_models()
    assert len(closes) == 2


def test_the_cli_closes_its_registry_at_the_end_of_each_command(tmp_path, closes):
    pt2reg = invoker(tmp_path / "home")
    for _ in range(3):
        assert pt2reg("list", "--json").exit_code == 0
    assert len(closes) == 3
    assert pt2reg("show", "nothing@1").exit_code == 3  # closed on the error path too
    assert len(closes) == 4


def test_load_of_a_ref_closes_the_registry_it_made(bundles, settings, closes, monkeypatch):
    import registry.runtime.loader as loader

    monkeypatch.setenv("PT2REG_HOME", str(settings.home))
    with Registry(settings) as reg:
        reg.push(bundles["v0"], "m", detect_git=False)
    closes.clear()
    monkeypatch.setattr(loader, "load_bundle", lambda src, **kwargs: src)  # no torch needed here
    src = loader.load("m@1")
    assert isinstance(src, MaterializedBundle) and (src.name, src.version) == ("m", 1)
    assert len(closes) == 1


# -- open_source -------------------------------------------------------------------------------

def test_open_source_of_a_file_verifies_it_into_the_cache(bundles, settings):
    with Registry(settings) as reg:
        src = open_source(bundles["v0"], registry=reg)
        again = open_source(str(bundles["v0"]), registry=reg)
    assert not (settings.home / "registry.db").exists()  # a file needs no database
    assert src.name is None and src.label == str(bundles["v0"]) and again.digest == src.digest
    for path in src.files.values():
        assert path.is_file() and settings.cache_dir in path.parents
    with Registry(settings) as reg:
        assert open_source(src, registry=reg) == src  # already local: taken as is


def test_open_source_of_a_missing_file_is_not_found(settings, tmp_path):
    with Registry(settings) as reg:
        for text in ("nope.pt2b", str(tmp_path / "missing"), "./model"):
            with pytest.raises(NotFoundError, match="no such file") as info:
                open_source(text, registry=reg)
            assert info.value.exit_code == 3 and info.value.one_line().startswith(f"{text}: no such file")
        with pytest.raises(UsageError):
            open_source("Not A Ref!", registry=reg)
    assert parse_source("team/bert@prod").alias == "prod"


def test_open_source_of_a_ref_resolves_it_once(bundles, settings, resolves):
    with Registry(settings) as reg:
        reg.push(bundles["v0"], "m", aliases=["prod"], detect_git=False)
        resolves.clear()
        src = open_source("m@prod", registry=reg)
    assert (src.name, src.version, src.label) == ("m", 1, "m@1")
    assert resolves == ["m@prod"]
    assert all(p.is_file() for p in src.files.values())


# -- a ref resolved once per command -----------------------------------------------------------

def test_pull_and_inspect_resolve_a_ref_once(bundles, tmp_path, resolves):
    pt2reg = invoker(tmp_path / "home")
    assert pt2reg("push", bundles["v0"], "--name", "m", "--alias", "prod").exit_code == 0
    resolves.clear()
    r = pt2reg("pull", "m@prod", "-o", tmp_path / "out.pt2b", "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["version"] == 1
    assert resolves == ["m@prod"]
    resolves.clear()
    assert pt2reg("inspect", "m@prod", "--json").exit_code == 0
    assert resolves == ["m@prod"]
    # a digest pin this machine holds whole: the cache resolves it, the database is asked
    # once, by digest, for the version's number and status only
    digest = json.loads(r.stdout)["digest"]
    resolves.clear()
    r = pt2reg("pull", f"m@{digest}", "-o", tmp_path / "again.pt2b", "--json")
    assert r.exit_code == 0, r.output
    assert resolves == [f"m@{digest}"]


# -- the exit-code policy lives in the report --------------------------------------------------

def test_raise_for_status_decides_exit_5_for_pickles_and_native_code_else_4():
    CompatReport(True, ()).raise_for_status()
    info = Finding("info", "native-code", "enc", "skipped the AOTInductor variant")
    CompatReport(True, (info,)).raise_for_status()
    ops = Finding("error", "custom-op-missing", "enc", "custom op mylib::f is not registered", fix="import it")
    pickle = Finding("error", "pickle", "enc", "program 'enc' holds pickled data", fix="--trust-pickle")
    with pytest.raises(IncompatibleError) as bad:
        CompatReport(False, (ops,)).raise_for_status()
    assert bad.value.exit_code == 4 and bad.value.one_line().startswith(
        "not compatible: custom op mylib::f is not registered")
    assert bad.value.findings == [ops]
    with pytest.raises(UnsafeArchiveError) as unsafe:
        CompatReport(False, (ops, pickle)).raise_for_status()
    assert unsafe.value.exit_code == 5
    assert unsafe.value.one_line().startswith("refused: program 'enc' holds pickled data (+1 more)")
