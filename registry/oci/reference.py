"""OCI references: ``[oci://]HOST[:PORT]/REPOSITORY[:TAG][@sha256:HEX]``, pure values, no IO.

The grammar is the distribution spec's (``reference`` of ``distribution/reference``) with one
rule of ours: the host is always written. ``team/m:v1`` could be Docker Hub's ``docker.io/team/m``
or a file or a model ref; ``ghcr.io/team/m:v1`` is only an OCI reference. So the meaning of
what a user types never depends on a default registry::

    >>> r = OciReference.parse("oci://127.0.0.1:5000/team/m@sha256:" + "a" * 64)
    >>> r.host, r.repository, r.tag, r.pinned
    ('127.0.0.1:5000', 'team/m', None, True)
    >>> r.scheme(insecure=False)    # loopback: plain HTTP
    'http'
    >>> OciReference.parse("ghcr.io/team/m:v1").scheme(insecure=False)
    'https'
"""
from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ..errors import UsageError
from ..refs import DIGEST_RE

__all__ = ["OciReference", "OCI_PREFIX", "is_loopback", "looks_like_oci"]

OCI_PREFIX = "oci://"
# distribution/reference: a component is [a-z0-9]+ joined by '.', '_', '__' or one or more '-'
_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REPOSITORY_RE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT})*\Z")
_TAG_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}\Z")
# a DNS name (labels of letters, digits and '-'), an IPv4 address or a bracketed IPv6 one, and a port
_HOST_RE = re.compile(r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*"
                      r"|\[[0-9A-Fa-f:.]+\])(?::[0-9]{1,5})?\Z")
#: the distribution spec caps a repository name (with the host) at 255 characters
MAX_NAME = 255
_HINT = "write HOST[:PORT]/REPOSITORY[:TAG][@sha256:HEX], e.g. ghcr.io/team/model@sha256:<64 hex>"


def looks_like_oci(text: str) -> bool:
    """True for text written as an OCI location (``oci://...``): what ``registry.load`` and
    ``materialize`` take for one, by its text alone."""
    return isinstance(text, str) and text.startswith(OCI_PREFIX)


def is_loopback(host: str) -> bool:
    """``localhost``, ``127.0.0.0/8`` or ``::1`` (with or without a port)."""
    name = host
    if name.startswith("["):
        name = name[1:name.index("]")] if "]" in name else name
    elif name.count(":") == 1:
        name = name.rsplit(":", 1)[0]
    if name.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OciReference:
    """Where an artifact lives in an OCI registry: ``host`` (with its port), ``repository``,
    and a ``tag`` and/or a ``digest`` (``sha256:<hex>``; with both, the digest is what is read)."""

    host: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> OciReference:
        """Parse ``[oci://]HOST[:PORT]/REPO[:TAG][@sha256:HEX]``; ``UsageError`` (exit 2) naming
        what is wrong otherwise."""
        if not isinstance(text, str) or not text:
            raise UsageError("an OCI reference is empty", hint=_HINT)
        rest = text[len(OCI_PREFIX):] if text.startswith(OCI_PREFIX) else text
        if "://" in rest:
            raise UsageError(f"invalid OCI reference {text!r}: only oci:// may prefix it", hint=_HINT)
        digest = None
        if "@" in rest:
            rest, digest = rest.split("@", 1)
            if not DIGEST_RE.match(digest):
                raise UsageError(f"invalid OCI reference {text!r}: {digest!r} is not a sha256 digest",
                                 hint="a pin is @sha256:<64 lowercase hex>")
        host, sep, path = rest.partition("/")
        if not sep or not path:
            raise UsageError(f"invalid OCI reference {text!r}: it names no repository", hint=_HINT)
        if not _HOST_RE.match(host) or not ("." in host or ":" in host or host == "localhost"):
            raise UsageError(f"invalid OCI reference {text!r}: {host!r} is not a registry host",
                             hint="the registry host is always written (ghcr.io, 127.0.0.1:5000, localhost:5000)")
        tag = None
        last = path.rsplit("/", 1)[-1]
        if ":" in last:
            path, tag = path.rsplit(":", 1)
            if not _TAG_RE.match(tag):
                raise UsageError(f"invalid OCI reference {text!r}: bad tag {tag!r}",
                                 hint="a tag is up to 128 letters, digits, '_', '.' and '-'")
        if not _REPOSITORY_RE.match(path) or len(host) + 1 + len(path) > MAX_NAME:
            raise UsageError(f"invalid OCI reference {text!r}: bad repository {path!r}",
                             hint="a repository is lowercase letters and digits in '/'-separated parts, "
                                  "joined by '.', '_' or '-'")
        return cls(host=host.lower(), repository=path, tag=tag, digest=digest)

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    @property
    def reference(self) -> str:
        """What the distribution API takes after ``/manifests/``: the digest, else the tag."""
        if self.digest is not None:
            return self.digest
        if self.tag is None:
            raise UsageError(f"{self} names neither a tag nor a digest", hint=_HINT)
        return self.tag

    def with_digest(self, digest: str) -> OciReference:
        return OciReference(self.host, self.repository, None, digest)

    def scheme(self, *, insecure: bool) -> str:
        """``https``, unless ``insecure`` or the host is loopback (plain HTTP there)."""
        return "http" if insecure or is_loopback(self.host) else "https"

    def base_url(self, *, insecure: bool) -> str:
        return f"{self.scheme(insecure=insecure)}://{self.host}"

    @property
    def location(self) -> str:
        """``HOST/REPOSITORY``, what a trust rule's ``oci`` glob matches."""
        return f"{self.host}/{self.repository}"

    def __str__(self) -> str:
        out = self.location
        if self.tag is not None:
            out += f":{self.tag}"
        if self.digest is not None:
            out += f"@{self.digest}"
        return out
