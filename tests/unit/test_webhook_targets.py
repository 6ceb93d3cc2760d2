"""``registry.access.webhook_targets`` without a network: which addresses a webhook may reach, the
operator's allowlist, and the pinned request (the checked address, the name kept for Host and TLS)."""
from __future__ import annotations

import ipaddress

import pytest

from registry.access.webhook_targets import TargetPolicy, TargetRefused, address_kind, check_new_target, pin
from registry.errors import UsageError


def _dns(*addresses: str):
    return lambda host, port: [ipaddress.ip_address(a) for a in addresses]


@pytest.mark.parametrize("address, kind", [
    ("127.0.0.1", "loopback"), ("::1", "loopback"), ("0.0.0.0", "unspecified"), ("::", "unspecified"),
    ("10.1.1.1", "private"), ("172.31.0.1", "private"), ("192.168.0.1", "private"), ("fd00::1", "private"),
    ("169.254.169.254", "cloud metadata"), ("fe80::1", "link-local"), ("224.0.0.251", "multicast"),
    ("ff02::1", "multicast"), ("100.64.0.1", "not globally routable"), ("::ffff:127.0.0.1", "loopback"),
    ("64:ff9b::a9fe:a9fe", "cloud metadata"), ("2002:c0a8:0101::", "private"), ("240.0.0.1", "private")])
def test_internal_addresses_are_named(address: str, kind: str) -> None:
    assert kind in (address_kind(ipaddress.ip_address(address)) or ""), address


@pytest.mark.parametrize("address", ["93.184.216.34", "2606:4700::1111", "8.8.8.8"])
def test_global_unicast_addresses_pass(address: str) -> None:
    assert address_kind(ipaddress.ip_address(address)) is None


def test_the_allowlist_names_hosts_suffixes_and_networks() -> None:
    policy = TargetPolicy.parse("hooks.internal, *.corp.example 10.20.0.0/16 ::1")
    assert policy.refusal(ipaddress.ip_address("10.20.3.4"), "x") is None
    assert policy.refusal(ipaddress.ip_address("10.21.3.4"), "x") == "a private address"
    assert policy.refusal(ipaddress.ip_address("127.0.0.1"), "HOOKS.internal.") is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.1"), "a.b.corp.example") is None
    assert policy.refusal(ipaddress.ip_address("127.0.0.1"), "corp.example.evil") == "a loopback address"
    assert policy.refusal(ipaddress.ip_address("::1"), "x") is None
    for bad in ("http://x", "a..b", "10.0.0.0/40", "*.", "h@st"):
        with pytest.raises(UsageError, match="PT2REG_WEBHOOK_ALLOW"):
            TargetPolicy.parse(bad)
    assert TargetPolicy.from_env({}) == TargetPolicy()


def test_a_name_is_refused_if_any_address_it_resolves_to_is_internal() -> None:
    check_new_target("https://hooks.example/x", TargetPolicy(), _dns("93.184.216.34"))
    with pytest.raises(TargetRefused, match="hooks.example resolves to a loopback address"):
        check_new_target("https://hooks.example/x", TargetPolicy(), _dns("93.184.216.34", "127.0.0.1"))
    with pytest.raises(TargetRefused, match="localhost is a loopback name"):
        check_new_target("http://LocalHost./x", TargetPolicy(), _dns("93.184.216.34"))

    def no_such_name(host: str, port: int) -> list:
        raise OSError("no such name")
    check_new_target("https://not-yet.example/x", TargetPolicy(), no_such_name)  # judged at delivery
    with pytest.raises(OSError):
        pin("https://not-yet.example/x", TargetPolicy(), no_such_name)


def test_pin_sends_to_the_checked_address_with_the_name_kept() -> None:
    got = pin("http://hooks.example:8080/p?q=1#frag", TargetPolicy(), _dns("2606:4700::1111", "93.184.216.34"))
    assert (got.url, got.headers, got.extensions) == ("http://[2606:4700::1111]:8080/p?q=1",
                                                      {"host": "hooks.example:8080"}, {})
    got = pin("https://hooks.example", TargetPolicy(), _dns("93.184.216.34"))
    assert (got.url, got.extensions) == ("https://93.184.216.34/", {"sni_hostname": "hooks.example"})
    with pytest.raises(TargetRefused):
        pin("https://hooks.example", TargetPolicy(), _dns("10.0.0.1"))
    assert pin("https://hooks.example", TargetPolicy.parse("10.0.0.0/8"), _dns("10.0.0.1")).address == "10.0.0.1"
