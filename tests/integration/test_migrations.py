"""Alembic migrations: one head, a migrated schema equal to the ORM, and the upgrade policy."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text

from registry.errors import DatabaseOutdatedError, StoreError
from registry.store import migrate
from registry.store.engine import make_engine
from registry.store.migrate import current_revision, ensure_schema, head_revision, heads, script_location, upgrade
from registry.store.orm import Base
from tests.store_calls import publish

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine(db_url):
    engine = make_engine(db_url)
    yield engine
    engine.dispose()


def schema_diffs(engine) -> list:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        return compare_metadata(context, Base.metadata)


def test_exactly_one_head():
    assert len(heads()) == 1
    assert head_revision() == heads()[0]


def test_scripts_found_from_a_source_checkout():
    assert (script_location() / "env.py").is_file()
    assert (script_location() / "versions" / "0001_initial.py").is_file()


def test_upgrade_empty_database_matches_orm(engine):
    assert current_revision(engine) is None
    assert upgrade(engine) == (None, head_revision())
    assert current_revision(engine) == head_revision()
    assert schema_diffs(engine) == []
    tables = set(inspect(engine).get_table_names())
    assert set(Base.metadata.tables) <= tables


def test_upgrade_is_idempotent_and_downgrade_round_trips(engine):
    upgrade(engine)
    assert upgrade(engine) == (head_revision(), head_revision())
    from alembic import command

    with engine.begin() as conn:
        command.downgrade(migrate._config(conn), "base")
    assert not inspect(engine).has_table("versions")
    upgrade(engine)
    assert schema_diffs(engine) == []


def test_fresh_database_is_created_only_when_allowed(engine):
    with pytest.raises(DatabaseOutdatedError, match="no registry schema") as caught:
        ensure_schema(engine, auto_create=False)
    assert "pt2reg db upgrade" in caught.value.one_line()
    assert current_revision(engine) is None
    ensure_schema(engine, auto_create=True)
    assert current_revision(engine) == head_revision()
    ensure_schema(engine, auto_create=False)  # at head: nothing to do


def test_database_ahead_of_the_software_is_refused(engine):
    upgrade(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '9999_from_the_future'"))
    for auto_create in (True, False):
        with pytest.raises(StoreError, match="older than the database") as caught:
            ensure_schema(engine, auto_create=auto_create)
        assert not isinstance(caught.value, DatabaseOutdatedError)
    with pytest.raises(StoreError, match="older than the database"):
        upgrade(engine)


def test_database_behind_head_needs_an_explicit_upgrade(engine, tmp_path, monkeypatch):
    upgrade(engine)  # at the shipped head
    shipped = head_revision()
    scripts = tmp_path / "scripts"
    shutil.copytree(script_location(), scripts)
    (scripts / "versions" / "0002_next.py").write_text(textwrap.dedent(f"""\
        import sqlalchemy as sa
        from alembic import op
        revision = "0002_next"
        down_revision = {head_revision()!r}
        branch_labels = depends_on = None
        def upgrade():
            with op.batch_alter_table("models") as batch:
                batch.add_column(sa.Column("note", sa.Text(), nullable=True))
        def downgrade():
            with op.batch_alter_table("models") as batch:
                batch.drop_column("note")
        """))
    monkeypatch.setattr(migrate, "script_location", lambda: scripts)
    monkeypatch.setattr(migrate, "HEAD_REVISION", "0002_next")  # what the next release ships
    with pytest.raises(DatabaseOutdatedError, match="behind") as caught:
        ensure_schema(engine, auto_create=True)  # never migrate an existing database silently
    assert (caught.value.current, caught.value.head) == (shipped, "0002_next")
    assert upgrade(engine) == (shipped, "0002_next")
    assert "note" in {c["name"] for c in inspect(engine).get_columns("models")}
    ensure_schema(engine, auto_create=False)


def test_a_registry_with_data_at_0002_upgrades_to_head_and_its_chain_verifies(engine):
    """Versions, aliases and events written before tokens, policies and webhooks existed: the
    data is made at head, the schema taken back to 0002 (the newer tables dropped, the rows in
    the older ones kept), then upgraded again; today's features work on it and the chain holds."""
    from alembic import command

    from registry.store import SqlMetadataStore

    store = SqlMetadataStore(engine)
    upgrade(engine)
    publish(store, "team/m", "sha256:" + "a" * 64, "{}", 2, [("sha256:" + "b" * 64, 2)],
                  aliases=["prod"], actor="ana", host="h")
    with engine.begin() as conn:
        command.downgrade(migrate._config(conn), "0002_audit_version_fields")
    assert not {"tokens", "alias_policies", "webhooks"} & set(inspect(engine).get_table_names())
    assert upgrade(engine) == ("0002_audit_version_fields", migrate.HEAD_REVISION)
    assert schema_diffs(engine) == []
    record, secret = store.create_token("ci", ["model:team/*:pull"], expires_at=None,
                                        actor="ana", host="h")
    assert store.authenticate(secret).token_id == record.id
    assert store.resolve("team/m@prod").number == 1
    assert store.verify_audit_chain().ok


def test_tables_without_revision_are_not_touched(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'other.db'}")
    Base.metadata.create_all(engine)
    with pytest.raises(StoreError, match="no schema revision"):
        ensure_schema(engine, auto_create=True)
    engine.dispose()


def test_env_py_runs_from_the_alembic_command_line(tmp_path):
    ini = tmp_path / "alembic.ini"
    ini.write_text(f"[alembic]\nscript_location = {REPO / 'migrations'}\n"
                   f"prepend_sys_path = {REPO}\n")
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    alembic = [sys.executable, "-m", "alembic", "-c", str(ini), "-x", f"url={url}"]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for args in (["upgrade", "head"], ["check"], ["current"]):
        done = subprocess.run(alembic + args, capture_output=True, text=True, env=env,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    assert f"{head_revision()} (head)" in done.stdout


def test_installed_layout_finds_scripts_as_a_package(tmp_path):
    """After ``pip install`` the scripts live in ``registry._migrations``: mimic that layout."""
    site = tmp_path / "site"
    shutil.copytree(REPO / "registry", site / "registry",
                    ignore=shutil.ignore_patterns("__pycache__", "_migrations"))
    shutil.copytree(REPO / "migrations", site / "registry" / "_migrations",
                    ignore=shutil.ignore_patterns("__pycache__"))
    (site / "registry" / "__init__.py").touch(exist_ok=True)
    code = textwrap.dedent(f"""\
        from registry.store import make_engine, ensure_schema, current_revision
        from registry.store.migrate import script_location
        assert "site/registry/_migrations" in str(script_location()), script_location()
        engine = make_engine("sqlite:///{tmp_path / 'installed.db'}")
        ensure_schema(engine, auto_create=True)
        print(current_revision(engine))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == head_revision()


def test_head_constant_matches_the_scripts():
    """ensure_schema's fast path compares against HEAD_REVISION without importing Alembic."""
    from registry.store.migrate import HEAD_REVISION, head_revision

    assert HEAD_REVISION == head_revision()
