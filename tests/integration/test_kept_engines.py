"""The engines a process keeps for the stores it opens on one database (``store.engine.kept_engine``):
a store per pull, as ``registry.load`` opens, compiles its statements once per process, and
nothing is shared that must not be (an in-memory database, a file replaced since, a forked child)."""
from __future__ import annotations

import os
import shutil

import pytest

from registry.errors import DatabaseOutdatedError, NotFoundError
from registry.store import engine as engines
from registry.store import open_metadata_store


@pytest.fixture
def disposed(monkeypatch):
    """The engines disposed from now on (their dispose calls, recorded)."""
    seen = []
    real = engines.Engine.dispose

    def dispose(self, close=True):
        seen.append(self)
        return real(self, close)

    monkeypatch.setattr(engines.Engine, "dispose", dispose)
    return seen


def test_stores_on_one_database_share_its_engine_until_it_is_replaced(tmp_path, disposed):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_metadata_store(url, auto_create=True) as a, open_metadata_store(url, auto_create=True) as b:
        assert a.engine is b.engine
        with pytest.raises(NotFoundError):
            a.resolve("m@1")
    with open_metadata_store(url, auto_create=True) as c:
        assert c.engine is a.engine and a.engine not in disposed   # kept after both closed
    shutil.copy(tmp_path / "r.db", tmp_path / "copy.db")
    os.replace(tmp_path / "copy.db", tmp_path / "r.db")          # a new file (inode) at that path
    with open_metadata_store(url, auto_create=True) as d:
        assert d.engine is not a.engine
    assert a.engine in disposed
    (tmp_path / "r.db").unlink()
    with open_metadata_store(url, auto_create=True) as e:      # removed: a new engine, a new database
        assert e.engine is not d.engine and e.list_models() == []


def test_an_in_memory_database_is_never_shared(disposed):
    with open_metadata_store("sqlite://", auto_create=True) as a:
        with open_metadata_store("sqlite://", auto_create=True) as b:
            assert a.engine is not b.engine
    assert a.engine in disposed and b.engine in disposed


def test_at_most_keep_engines_are_kept_the_oldest_unused_one_disposed(tmp_path, disposed):
    urls = [f"sqlite:///{tmp_path / f'r{i}.db'}" for i in range(engines.KEEP_ENGINES + 1)]
    busy = open_metadata_store(urls[0], auto_create=True)    # still in use when it is pushed out
    made = [busy.engine]
    for url in urls[1:]:
        with open_metadata_store(url, auto_create=True) as s:
            made.append(s.engine)
    assert made[0] not in disposed                          # in use: disposed when it is closed
    busy.close()
    busy.close()                                            # idempotent
    assert disposed.count(made[0]) == 1 and not set(made[1:]) & set(disposed)
    with open_metadata_store(urls[0], auto_create=True) as again:
        assert again.engine is not made[0]


def test_a_database_found_unusable_is_not_kept(tmp_path, disposed, monkeypatch):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_metadata_store(url, auto_create=True) as s:
        first = s.engine

    def outdated(engine, *, auto_create):
        raise DatabaseOutdatedError("the database is behind")

    monkeypatch.setattr("registry.store.ensure_schema", outdated)
    with pytest.raises(DatabaseOutdatedError):
        open_metadata_store(url, auto_create=False)
    assert first in disposed
    monkeypatch.undo()
    with open_metadata_store(url, auto_create=True) as s:
        assert s.engine is not first


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_keeps_none_of_its_parents_engines(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_metadata_store(url, auto_create=True) as s:
        parent = s.engine
    pid = os.fork()
    if pid == 0:   # the child: a store of its own, on a connection of its own
        try:
            with open_metadata_store(url, auto_create=True) as mine:
                ok = mine.engine is not parent and mine.list_models() == []
            os._exit(0 if ok else 1)
        except BaseException:
            os._exit(2)
    _pid, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    with open_metadata_store(url, auto_create=True) as s:
        assert s.engine is parent and s.list_models() == []
