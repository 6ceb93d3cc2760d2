"""The engines a process keeps for the stores it opens on one database (``store.engine.kept_engine``):
a store per pull, as ``registry.load`` opens, compiles its statements once per process, and
nothing is shared that must not be (an in-memory database, a file replaced since, a forked child)."""
from __future__ import annotations

import os
import shutil
import signal
import time

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


def _open_files(path) -> int:
    """How many of this process's file descriptors are open on ``path`` (or its -wal, -shm)."""
    names = {str(path), f"{path}-wal", f"{path}-shm"}
    return sum(os.path.realpath(f"/proc/self/fd/{fd}") in names for fd in os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="/proc")
def test_stores_on_one_database_share_its_engine_and_close_its_connections(tmp_path, disposed):
    """The engine (its compiled statements) is shared; its connections are closed with the last
    store, so the write-ahead log is checkpointed into the file, which a copy then holds whole,
    and a file replaced or restored in place is what the next store reads."""
    db = tmp_path / "r.db"
    url = f"sqlite:///{db}"
    with open_metadata_store(url, auto_create=True) as a, open_metadata_store(url, auto_create=True) as b:
        assert a.engine is b.engine
        with pytest.raises(NotFoundError):
            a.resolve("m@1")
        a.record_event("pull", actor="me", host="here", model="m")
        assert _open_files(db) > 0
    assert a.engine in disposed and _open_files(db) == 0
    assert not (tmp_path / "r.db-wal").exists() or (tmp_path / "r.db-wal").stat().st_size == 0
    shutil.copy(db, tmp_path / "backup.db")                    # a copy of the closed file is whole
    with open_metadata_store(f"sqlite:///{tmp_path / 'backup.db'}", auto_create=False) as c:
        assert [e.action for e in c.events()] == ["pull"]
    with open_metadata_store(url, auto_create=True) as d:
        assert d.engine is a.engine                             # kept: its statements compiled once
        d.record_event("push", actor="me", host="here", model="m")
    with open(tmp_path / "backup.db", "rb") as src, open(db, "r+b") as dst:   # restored in place
        dst.truncate(0)
        shutil.copyfileobj(src, dst)
    for suffix in ("-wal", "-shm"):
        (tmp_path / f"r.db{suffix}").unlink(missing_ok=True)
    with open_metadata_store(url, auto_create=True) as e:
        assert e.engine is a.engine and [x.action for x in e.events()] == ["pull"]
    db.unlink()
    with open_metadata_store(url, auto_create=True) as f:      # removed: a new database
        assert f.list_models() == [] and f.events() == []


def test_a_file_replaced_while_its_engine_is_in_use_gets_a_new_engine(tmp_path, disposed):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    with open_metadata_store(url, auto_create=True) as a:
        shutil.copy(tmp_path / "r.db", tmp_path / "copy.db")
        os.replace(tmp_path / "copy.db", tmp_path / "r.db")      # a new file (inode) at that path
        with open_metadata_store(url, auto_create=True) as b:
            assert b.engine is not a.engine
        assert a.engine not in disposed                         # in use: disposed when it is closed
    assert a.engine in disposed


def test_an_in_memory_database_is_never_shared(disposed):
    with open_metadata_store("sqlite://", auto_create=True) as a:
        with open_metadata_store("sqlite://", auto_create=True) as b:
            assert a.engine is not b.engine
    assert a.engine in disposed and b.engine in disposed


def test_at_most_keep_engines_are_kept_the_least_recently_used_one_dropped(tmp_path, disposed):
    urls = [f"sqlite:///{tmp_path / f'r{i}.db'}" for i in range(engines.KEEP_ENGINES + 1)]
    busy = open_metadata_store(urls[0], auto_create=True)    # still in use when it is pushed out
    made = [busy.engine]
    for url in urls[1:]:
        with open_metadata_store(url, auto_create=True) as s:
            made.append(s.engine)
    assert made[0] not in disposed                          # in use: disposed when it is closed
    busy.close()
    busy.close()                                            # idempotent
    assert disposed.count(made[0]) == 1
    with open_metadata_store(urls[0], auto_create=True) as again:
        assert again.engine is not made[0]                  # dropped: a new one
    with open_metadata_store(urls[-1], auto_create=True) as kept:
        assert kept.engine is made[-1]


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
    deadline = time.monotonic() + 60   # a child stuck on a lock fails the test, not the run
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        pytest.fail("the forked child did not finish within 60 s")
    assert os.waitstatus_to_exitcode(done[1]) == 0
    with open_metadata_store(url, auto_create=True) as s:
        assert s.engine is parent and s.list_models() == []
