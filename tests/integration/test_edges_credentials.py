"""Issue 41, class 2: a token goes only to the registry it was configured for.

The hostile fixture: a listener on loopback standing for another host (an attacker's, or any
host a ``pt2reg://`` URI can name: the shipped KServe storage container made this reachable by
anyone who may create an InferenceService). It records every request and its
``Authorization`` header, and refuses everything (401). Before the fix,
``materialize pt2reg://ITS-HOST/...`` sent ``Bearer $PT2REG_TOKEN`` there.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.cli_inprocess import run_in_process

TOKEN = "pt2r_" + "s" * 43          # the configured registry's secret
LOGIN = "pt2r_" + "l" * 43          # a login saved for the other host


class _Listener:
    def __init__(self) -> None:
        self.seen: list[dict[str, str | None]] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                seen.append({"path": self.path, "authorization": self.headers.get("Authorization")})
                body = json.dumps({"error": {"type": "NotAuthenticatedError", "message": "no", "exit_code": 7}})
                self.send_response(401)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            do_GET = do_POST = do_HEAD = do_PUT = _answer

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def tokens(self) -> set[str | None]:
        return {s["authorization"] for s in self.seen}


@pytest.fixture
def listener() -> Iterator[_Listener]:
    lst = _Listener()
    lst.thread.start()
    yield lst
    lst.server.shutdown()
    lst.server.server_close()


def _materialize(uri: str, dest: Path, *extra: str, **env: str | None):
    base = {"PT2REG_HOME": None, "PT2REG_URL": None, "PT2REG_TOKEN": None, "PT2REG_ALLOWED_REGISTRIES": None,
            "PT2REG_DB": None, "PT2REG_STORE": None}
    return run_in_process(*extra, "materialize", uri, dest, "--layout", "files", env={**base, **env})


def _line(r) -> str:
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


@pytest.mark.parametrize("how", ["env", "token-file", "no-configured-registry", "https-scheme"])
def test_a_uri_naming_another_host_gets_no_token(listener, tmp_path, how):
    other = listener.url.removeprefix("http://")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    configured = "https://registry.internal.example"
    if how == "env":
        r = _materialize(f"pt2reg://{other}/team/m@1", tmp_path / "d", PT2REG_URL=configured, PT2REG_TOKEN=TOKEN)
    elif how == "token-file":
        r = _materialize(f"pt2reg://{other}/team/m@1", tmp_path / "d", "--registry", configured,
                         "--token-file", str(token_file))
    elif how == "no-configured-registry":  # a token bound to nothing is sent nowhere a URI points
        r = _materialize(f"pt2reg://{other}/team/m@1", tmp_path / "d", PT2REG_TOKEN=TOKEN)
    else:  # the listener's host and port under another scheme is another origin
        r = _materialize(f"pt2regs://{other}/team/m@1", tmp_path / "d", PT2REG_URL=listener.url, PT2REG_TOKEN=TOKEN)
    assert r.returncode == 2, r.stderr
    line = _line(r)
    assert "credentials are never sent to a registry because a URI names it" in line
    assert "PT2REG_ALLOWED_REGISTRIES" in line and TOKEN not in r.stderr + r.stdout
    assert listener.seen == [] and not (tmp_path / "d").exists()


def test_an_allowed_other_registry_gets_only_its_own_login(listener, tmp_path):
    other = listener.url.removeprefix("http://")
    home = tmp_path / "home"
    r = _materialize(f"pt2reg://{other}/team/m@1", tmp_path / "d", PT2REG_URL="https://registry.internal.example",
                     PT2REG_TOKEN=TOKEN, PT2REG_ALLOWED_REGISTRIES=listener.url, PT2REG_HOME=str(home))
    assert r.returncode == 7 and listener.seen and listener.tokens == {None}, (r.stderr, listener.seen)
    assert "no token was sent" in _line(r)
    from registry.remote.credentials import save_login

    save_login(home, listener.url, LOGIN, owner="ci", token_id=3)
    listener.seen.clear()
    r = _materialize(f"pt2reg://{other}/team/m@1", tmp_path / "d", PT2REG_URL="https://registry.internal.example",
                     PT2REG_TOKEN=TOKEN, PT2REG_ALLOWED_REGISTRIES=f"https://x.example, {listener.url}/",
                     PT2REG_HOME=str(home))
    assert r.returncode == 7 and listener.tokens == {f"Bearer {LOGIN}"}
    assert f"the login saved for {listener.url}" in _line(r)


def test_the_configured_registry_named_in_the_uri_gets_its_token(listener, tmp_path):
    for uri in (f"pt2reg://{listener.url.removeprefix('http://')}/team/m@1", "pt2reg:///team/m@1"):
        listener.seen.clear()
        r = _materialize(uri, tmp_path / "d", PT2REG_URL=listener.url + "/", PT2REG_TOKEN=TOKEN)
        assert r.returncode == 7 and listener.tokens == {f"Bearer {TOKEN}"}, (uri, r.stderr)
        line = _line(r)
        assert "the token sent came from PT2REG_TOKEN" in line and TOKEN not in line


def test_a_refused_token_names_its_source(listener, tmp_path):
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    r = run_in_process("--registry", listener.url, "--token-file", token_file, "list",
                       env={"PT2REG_TOKEN": None, "PT2REG_URL": None, "PT2REG_HOME": str(tmp_path / "h")})
    assert r.returncode == 7 and f"the token sent came from --token-file {token_file}" in _line(r)


@pytest.mark.parametrize("flag", ["--db", "--store"])
def test_a_registry_server_and_a_direct_store_are_never_mixed(tmp_path, flag):
    value = f"sqlite:///{tmp_path / 'x.db'}" if flag == "--db" else f"file://{tmp_path / 'blobs'}"
    r = run_in_process(flag, value, "list", env={"PT2REG_URL": "https://registry.internal.example",
                                                  "PT2REG_HOME": str(tmp_path / "h")})
    assert r.returncode == 2 and "PT2REG_URL" in _line(r) and "which one?" in _line(r)
    assert not (tmp_path / "x.db").exists() and not (tmp_path / "blobs").exists()
