"""One JSON encoder for ``--json`` and the server (issue 44): the same record is the same JSON,
its times written one way."""
from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

from click.testing import CliRunner

from registry.format.jsondoc import dumps, encode
from registry.remote import wire
from registry.store.records import OciArtifactRecord


def test_the_server_and_the_cli_share_the_encoder():
    assert wire.encode is encode


def test_a_record_is_the_same_json_from_the_cli_and_the_server():
    import click

    from registry.cli._core import emit_json

    record = OciArtifactRecord("ghcr.io/a/m", "v1", "sha256:" + "a" * 64,
                               datetime(2026, 12, 4, 1, 2, 3, 456789, tzinfo=timezone(timedelta(hours=2))), "ana")

    @click.command()
    def show() -> None:
        emit_json({"record": record, "path": Path("/x/y")})

    printed = json.loads(CliRunner().invoke(show).stdout)
    assert printed["record"] == encode(record) == json.loads(dumps(record))
    assert printed["record"]["pushed_at"] == "2026-12-03T23:02:03.456789Z"   # UTC, Z, one way
    assert printed["path"] == "/x/y"
