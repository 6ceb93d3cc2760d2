"""Issue 41 (B): webhook targets as a server-side request forgery. An admin token registers URLs
on loopback, private, link-local (cloud metadata), multicast and other internal addresses, in
every spelling (IPv6, IPv4-mapped, decimal, ``localhost.``); a name resolves to a public address
when the webhook is added and to 127.0.0.1 when it is delivered (DNS rebinding), or to an
allowed address at the check and to another one a moment later. A real ``pt2reg serve`` refuses
each at add time (422 with the JSON error body; the CLI: exit 2, one line), refuses to call a
rebound name at delivery (the internal receiver gets nothing; the attempt shows no response),
and connects to the address it checked. Only the operator's ``PT2REG_WEBHOOK_ALLOW`` lets
internal targets through.

DNS is a stand-in (``tests/fake_dns/sitecustomize.py`` on the server's PYTHONPATH): no DNS server.
"""
from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fixtures_pt2 import cli_process, run_cli
from tests.integration.test_audit_head import publish
from tests.integration.test_webhooks import SECRET, _wait, verify_standard_webhook
from tests.services_server import ROOT, make_token, registry_server
from tests.webhook_receivers import Catcher

pytestmark = [pytest.mark.integration]

FAST = {"PT2REG_WEBHOOK_POLL": "0.1", "PT2REG_WEBHOOK_RETRY_BASE": "0.3", "PT2REG_WEBHOOK_RETRY_MAX": "1",
        "PT2REG_WEBHOOK_TIMEOUT": "5", "PT2REG_AUDIT_SIGN_INTERVAL": "0.5"}
#: what an internal service answers: it must never be readable through the registry
INSIDE = "internal-service-answer-4f1c"


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A SQLite registry with team/m@1 and @2, and a server over it allowing only 127.0.0.2
    (names resolved through the stand-in DNS file ``dns``)."""
    from registry.store import open_metadata_store

    db = f"sqlite:///{tmp_path / 'r.db'}"
    store = open_metadata_store(db, auto_create=True)
    publish(store, "team/m", 1)
    publish(store, "team/m", 2)
    admin = make_token(db, "ops", ["admin"])
    dns = tmp_path / "dns.json"
    dns.write_text("{}")
    env = {**FAST, "PT2REG_WEBHOOK_ALLOW": "127.0.0.2", "PT2REG_TEST_FAKE_DNS": str(dns),
           "PYTHONPATH": str(ROOT / "tests" / "fake_dns")}
    secret_file = tmp_path / "hook.secret"
    secret_file.write_text(SECRET)
    try:
        with registry_server(db, f"file://{tmp_path / 'store'}", env=env, log_dir=tmp_path / "srv") as server:
            yield {"server": server, "store": store, "admin": admin, "dns": dns, "db": db,
                   "secret_file": secret_file, "tmp": tmp_path,
                   "cli_env": {"PT2REG_URL": server.url, "PT2REG_TOKEN": admin, "PT2REG_DB": None,
                               "PT2REG_HOME": str(tmp_path / "client")}}
    finally:
        store.close()


def _add(reg: dict[str, Any], url: str) -> httpx.Response:
    return httpx.post(reg["server"].url + "/v1/webhooks", headers={"Authorization": f"Bearer {reg['admin']}"},
                      json={"url": url, "events": ["alias.moved"], "secret": SECRET}, timeout=60)


def _listed(reg: dict[str, Any], path: str) -> Any:
    r = httpx.get(reg["server"].url + path, headers={"Authorization": f"Bearer {reg['admin']}"}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


INTERNAL = ["http://127.0.0.1:{port}/hook", "http://127.1.2.3/", "http://localhost:{port}/x", "http://LOCALHOST./x",
            "http://api.localhost/x", "http://[::1]:{port}/", "http://0.0.0.0:{port}/", "http://[::]/",
            "http://10.0.0.7/", "http://172.16.9.9/", "http://192.168.1.1/admin", "http://100.64.0.1/",
            "http://169.254.169.254/latest/meta-data/iam/security-credentials/",
            "http://[fd00:ec2::254]/latest/meta-data/", "http://[fe80::1]/", "http://[fc00::1]/", "http://[fd12::1]/",
            "http://224.0.0.1/", "http://[ff02::1]/", "http://[::ffff:127.0.0.1]:{port}/", "http://[::ffff:a9fe:a9fe]/",
            "http://[64:ff9b::a9fe:a9fe]/", "http://[2002:7f00:1::]/", "http://2130706433:{port}/",
            "http://0x7f000001/", "http://192.0.2.1/", "http://255.255.255.255/", "https://127.0.0.1/",
            "http://inside.test/", "http://mixed.test/"]


def test_internal_targets_are_refused_when_added_through_the_api_and_the_cli(registry: dict[str, Any]) -> None:
    catcher = Catcher(answer=INSIDE)
    registry["dns"].write_text(json.dumps({"inside.test": ["10.1.2.3"], "mixed.test": [["93.184.216.34", "127.0.0.1"]]}))
    try:
        for url in (u.format(port=catcher.port) for u in INTERNAL):
            r = _add(registry, url)
            assert r.status_code == 422, (url, r.status_code, r.text)
            err = r.json()["error"]
            assert err["type"] == "UsageError" and err["exit_code"] == 2, (url, err)
            assert "is refused" in err["message"] and "PT2REG_WEBHOOK_ALLOW" in err["hint"], (url, err)
        for url in ("http://169.254.169.254/latest/meta-data/", f"http://localhost:{catcher.port}/",
                    "http://inside.test/x"):
            r = run_cli("webhook", "add", url, "--events", "alias.moved", "--secret-file",
                        str(registry["secret_file"]), env=registry["cli_env"])
            assert r.returncode == 2 and "is refused" in r.stderr, (url, r.stderr)
            assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr, r.stderr
        # nothing stored, nothing audited, nothing called
        assert _listed(registry, "/v1/webhooks")["webhooks"] == []
        assert not [e for e in registry["store"].events() if e.action.startswith("webhook")]
        assert catcher.requests() == []
    finally:
        catcher.close()


def test_a_name_rebound_to_loopback_is_never_called_and_the_checked_address_is_the_one_called(
        registry: dict[str, Any]) -> None:
    """rebind.test: public when added, 127.0.0.1 (where an internal service listens) when
    delivered. swap.test: 127.0.0.2 (allowed by the operator) at the check, 127.0.0.3 (not
    allowed, another service on the same port) at any later lookup: only 127.0.0.2 is called."""
    inside = Catcher("127.0.0.1", answer=INSIDE)
    good = Catcher("127.0.0.2", answer="allowed-receiver-ok")
    evil = Catcher("127.0.0.3", good.port, answer=INSIDE)
    dns = registry["dns"]
    try:
        dns.write_text(json.dumps({"rebind.test": ["93.184.216.34"], "swap.test": ["127.0.0.2"]}))
        rebind = _add(registry, f"http://rebind.test:{inside.port}/hook")
        swap = _add(registry, f"http://swap.test:{good.port}/hook")
        assert rebind.status_code == 200 and swap.status_code == 200, (rebind.text, swap.text)
        dns.write_text(json.dumps({"rebind.test": ["127.0.0.1"], "swap.test": ["127.0.0.2", "127.0.0.3"]}))
        registry["store"].set_alias("team/m", "prod", 1, actor="ana", host="h")

        def settled() -> Any:
            found = _listed(registry, "/v1/webhooks/deliveries")["deliveries"]
            by_hook = {d["webhook_id"]: d for d in found}
            hooks = (rebind.json()["id"], swap.json()["id"])
            if all(h in by_hook for h in hooks) and by_hook[hooks[0]]["attempts"] >= 2 \
                    and by_hook[hooks[1]]["status"] == "delivered":
                return by_hook[hooks[0]], by_hook[hooks[1]]
            return None
        refused, delivered = _wait(settled, "the rebound delivery refused twice and the swapped one delivered")
        assert inside.requests() == [] and evil.requests() == [], "a rebound name was called"
        [(path, headers, body, _)] = good.requests()
        assert headers["host"] == f"swap.test:{good.port}"  # the name kept, the checked address called
        assert verify_standard_webhook(SECRET, headers, body)["type"] == "alias.moved"
        for attempt in refused["history"]:
            assert not attempt["ok"] and attempt["status_code"] is None and attempt["response_excerpt"] is None
            assert attempt["error"] == f"webhook target http://rebind.test:{inside.port} is refused: rebind.test " \
                                       "resolves to a loopback address", attempt
        assert refused["status"] == "failing"  # retried with backoff like any failure
        assert delivered["history"][-1]["response_excerpt"] == "allowed-receiver-ok"  # excerpts still kept
        shown = json.dumps(_listed(registry, "/v1/webhooks/deliveries"))
        assert INSIDE not in shown and "127.0.0.1" not in shown
        table = run_cli("webhook", "deliveries", env=registry["cli_env"])
        assert table.returncode == 0 and INSIDE not in table.stdout
    finally:
        for c in (inside, good, evil):
            c.close()


def test_the_allowlist_lets_named_internal_targets_through_and_nothing_else(registry: dict[str, Any]) -> None:
    """PT2REG_WEBHOOK_ALLOW=127.0.0.2 on this server: that address is accepted, its neighbours
    are not; a bad allowlist stops ``pt2reg serve`` with one line before it listens."""
    assert _add(registry, "http://127.0.0.2:9/hook").status_code == 200
    for url in ("http://127.0.0.3:9/hook", "http://127.0.0.1:9/hook", "http://[::1]:9/"):
        assert _add(registry, url).status_code == 422, url
    assert [w["url"] for w in _listed(registry, "/v1/webhooks")["webhooks"]] == ["http://127.0.0.2:9/hook"]
    tmp = registry["tmp"]
    for bad in ("http://hooks.example", "10.0.0.0/33", "hooks..example"):
        r = cli_process("serve", "--db", f"sqlite:///{tmp / 'other.db'}", "--store", f"file://{tmp / 'other'}",
                        "--port", str(_free_port()), env={"PT2REG_WEBHOOK_ALLOW": bad, "PT2REG_HOME": str(tmp / "h")},
                        timeout=120)
        assert r.returncode == 2 and "PT2REG_WEBHOOK_ALLOW" in r.stderr, (bad, r.returncode, r.stderr[-500:])
        assert len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_the_direct_database_path_refuses_internal_targets_too(tmp_path: Path) -> None:
    """``pt2reg webhook add`` with database access (no server): the same refusal, one line,
    exit 2, nothing stored; the operator's allowlist in its environment lifts it."""
    db = f"sqlite:///{tmp_path / 'r.db'}"
    secret_file = tmp_path / "s"
    secret_file.write_text(SECRET)
    env = {"PT2REG_DB": db, "PT2REG_HOME": str(tmp_path / "home"), "PT2REG_WEBHOOK_ALLOW": None}
    for url in ("http://169.254.169.254/latest/meta-data/", "http://[::1]:8080/", "http://10.9.8.7/"):
        r = run_cli("webhook", "add", url, "--events", "alias.moved", "--secret-file", str(secret_file), env=env)
        assert r.returncode == 2 and "is refused" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
    listed = run_cli("webhook", "list", "--json", env=env)
    assert json.loads(listed.stdout)["webhooks"] == []
    r = run_cli("webhook", "add", "http://10.9.8.7/", "--events", "alias.moved", "--secret-file", str(secret_file),
                env={**env, "PT2REG_WEBHOOK_ALLOW": "10.0.0.0/8"})
    assert r.returncode == 0, r.stderr


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
