"""Where a webhook may be sent: the guard against server-side request forgery.

A webhook URL is hostile input: ``pt2reg serve`` POSTs to it from inside its own network, and
the start of each answer is readable back through ``pt2reg webhook deliveries``. So a target is
refused when its host is, or resolves to, an address that is not global unicast: loopback
(127.0.0.0/8, ::1), unspecified (0.0.0.0, ::), private (RFC 1918, fc00::/7, 100.64.0.0/10),
link-local (169.254.0.0/16 with the cloud metadata service 169.254.169.254, fe80::/10),
multicast, reserved and documentation ranges, and the IPv6 forms that carry such an IPv4
address (``::ffff:127.0.0.1``, NAT64 ``64:ff9b::/96``, 6to4 ``2002::/16``); ``localhost`` and
``*.localhost`` are refused by name. A name that resolves to several addresses is refused if
any of them is.

The operator's allowlist lifts this: ``PT2REG_WEBHOOK_ALLOW`` (read by ``pt2reg serve`` when it
starts, and by ``pt2reg webhook add`` on the direct database path), entries separated by commas
or spaces, each a host name (``hooks.internal``; ``*.corp.example`` for every name under it),
an address (``127.0.0.1``, ``::1``) or a network (``10.20.0.0/16``, ``fd00::/8``). A name entry
allows that name whatever it resolves to; an address or network entry allows the addresses in it.

Checked twice: when a webhook is added (:func:`check_new_target`: HTTP 422, exit 2 from the
CLI; a name that does not resolve then is accepted and judged at delivery), and before every
delivery against what the name resolves to *then* (:func:`pin`). The request goes to the checked
address itself (the URL's host replaced by it; the name kept in ``Host`` and as the TLS server
name, so the certificate is still verified for the name): a name that resolved to a public
address when checked and resolves to 127.0.0.1 a moment later (DNS rebinding) is never called.

    >>> policy = TargetPolicy.parse("10.0.0.0/8, hooks.internal")
    >>> policy.refusal(ipaddress.ip_address("10.1.2.3"), "x.example") is None
    True
    >>> policy.refusal(ipaddress.ip_address("169.254.169.254"), "x.example")
    'a link-local address (the cloud metadata service)'
"""
from __future__ import annotations

import ipaddress
import os
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from ..errors import UsageError

__all__ = ["ENV_ALLOW", "TargetPolicy", "TargetRefused", "Pinned", "address_kind", "resolve",
           "check_new_target", "pin"]

ENV_ALLOW = "PT2REG_WEBHOOK_ALLOW"

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Sequence[Address]]

_NAT64 = ipaddress.ip_network("64:ff9b::/96")
_METADATA = {ipaddress.ip_address("169.254.169.254"), ipaddress.ip_address("fd00:ec2::254")}
_HINT = f"an operator may allow internal targets with {ENV_ALLOW} (hosts and CIDRs; see pt2reg serve --help)"


class TargetRefused(UsageError):
    """422: a webhook target that is, or resolves to, an address the registry may not call."""

    status = 422


def _embedded_v4(ip: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one stands for (mapped, NAT64, 6to4), else None."""
    if ip.version != 6:
        return None
    assert isinstance(ip, ipaddress.IPv6Address)
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def address_kind(ip: Address) -> str | None:
    """Why ``ip`` is no place to send a webhook (``'a loopback address'`` ...), None when it is
    a global unicast address.

    >>> address_kind(ipaddress.ip_address("::ffff:10.0.0.1"))
    'a private address'
    >>> address_kind(ipaddress.ip_address("8.8.8.8")) is None
    True
    """
    inner = _embedded_v4(ip)
    if inner is not None and address_kind(inner) is not None:
        return address_kind(inner)
    if ip in _METADATA:
        return "a link-local address (the cloud metadata service)"
    for kind, test in (("an unspecified", ip.is_unspecified), ("a loopback", ip.is_loopback),
                       ("a link-local", ip.is_link_local), ("a multicast", ip.is_multicast),
                       ("a private", ip.is_private), ("a reserved", ip.is_reserved)):
        if test:
            return f"{kind} address"
    return None if ip.is_global else "an address that is not globally routable"


def _host(name: str) -> str:
    return name.lower().rstrip(".")


@dataclass(frozen=True)
class TargetPolicy:
    """The operator's allowlist: host names (exact, or ``*.suffix``) and networks."""

    hosts: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    networks: tuple[Network, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> TargetPolicy:
        """Entries separated by commas or whitespace; a bad entry is a UsageError naming it."""
        hosts, suffixes, networks = set(), [], []
        for entry in (text or "").replace(",", " ").split():
            try:
                networks.append(ipaddress.ip_network(entry.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            name = _host(entry)
            label = name[2:] if name.startswith("*.") else name
            if not label or any(not (part.isascii() and part.replace("-", "").replace("_", "").isalnum())
                                for part in label.split(".")):
                raise UsageError(f"{ENV_ALLOW}: {entry[:80]!r} is neither a host name, an address nor a network",
                                 hint="e.g. PT2REG_WEBHOOK_ALLOW='hooks.internal, *.corp.example, 10.0.0.0/8, ::1'")
            if name.startswith("*."):
                suffixes.append("." + label)
            else:
                hosts.add(name)
        return cls(frozenset(hosts), tuple(suffixes), tuple(networks))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TargetPolicy:
        return cls.parse((os.environ if environ is None else environ).get(ENV_ALLOW))

    def allows_host(self, host: str) -> bool:
        name = _host(host)
        return name in self.hosts or any(name.endswith(s) for s in self.suffixes)

    def refusal(self, ip: Address, host: str) -> str | None:
        """Why ``host`` at ``ip`` may not be called, None when it may."""
        if self.allows_host(host) or any(ip.version == n.version and ip in n for n in self.networks):
            return None
        return address_kind(ip)


def resolve(host: str, port: int) -> list[Address]:
    """Every address ``host`` resolves to now (``socket.gaierror`` when none)."""
    found = []
    for *_, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if ip not in found:
            found.append(ip)
    return found


def _literal(host: str) -> Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _shown(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"[:80]


def _checked(url: str, policy: TargetPolicy, resolver: Resolver, *, unresolved_ok: bool) -> list[Address]:
    """The addresses ``url``'s host stands for, all of them allowed (TargetRefused otherwise)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    literal = _literal(host)
    name = _host(host)
    if literal is None and not policy.allows_host(name) and (name == "localhost" or name.endswith(".localhost")):
        raise TargetRefused(f"webhook target {_shown(url)} is refused: {name} is a loopback name", hint=_HINT)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = list(resolver(host, port))
        except (OSError, UnicodeError):
            if unresolved_ok:
                return []
            raise
    for ip in addresses:
        why = policy.refusal(ip, host)
        if why is not None:
            shown = f"{ip} is {why}" if literal is not None else f"{name} resolves to {why}"
            raise TargetRefused(f"webhook target {_shown(url)} is refused: {shown}", hint=_HINT)
    return addresses


def check_new_target(url: str, policy: TargetPolicy, resolver: Resolver = resolve) -> None:
    """TargetRefused unless ``url`` (already validated as http(s) with a host) may be called
    under ``policy``; a name that does not resolve now passes (it is judged at delivery)."""
    _checked(url, policy, resolver, unresolved_ok=True)


@dataclass(frozen=True)
class Pinned:
    """A request to ``url``'s checked address: send to ``url`` with ``headers`` and
    ``extensions`` (httpx: ``sni_hostname`` verifies the certificate for the name)."""

    url: str
    headers: dict[str, str]
    extensions: dict[str, str]
    address: str


def pin(url: str, policy: TargetPolicy, resolver: Resolver = resolve) -> Pinned:
    """Resolve ``url``'s host now, check every address, and aim the request at the first:
    TargetRefused for a refused address, OSError when the name does not resolve.

    >>> pin("https://hooks.example/x?a=1", TargetPolicy(), lambda h, p: [ipaddress.ip_address("93.184.216.34")])
    Pinned(url='https://93.184.216.34/x?a=1', headers={'host': 'hooks.example'}, \
extensions={'sni_hostname': 'hooks.example'}, address='93.184.216.34')
    """
    parts = urlsplit(url)
    ip = _checked(url, policy, resolver, unresolved_ok=False)[0]
    shown = f"[{ip}]" if ip.version == 6 else str(ip)
    netloc = f"{shown}:{parts.port}" if parts.port else shown
    host = parts.hostname or ""
    sni = {"sni_hostname": host} if parts.scheme == "https" and _literal(host) is None else {}
    return Pinned(urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, "")),
                  {"host": parts.netloc}, sni, str(ip))
