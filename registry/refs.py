"""Model names and refs: ``NAME``, ``NAME@7``, ``NAME@prod``, ``NAME@sha256:<64 hex>``.

Pure value objects, no IO::

    >>> Ref.parse("team/bert@prod")
    Ref(name='team/bert', version=None, alias='prod', digest=None)
"""
from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass

from .digests import all_hex64
from .errors import UsageError

__all__ = ["Ref", "validate_name", "validate_alias", "validate_digest", "validate_digests", "NAME_RE", "DIGEST_RE"]

# \Z, not $: "$" also matches before a trailing newline, and "r/m\n" must not be a second "r/m"
NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_.\-]*(/[a-z0-9][a-z0-9_.\-]*)*\Z")
ALIAS_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]{0,63}\Z")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}\Z")
_VERSION_RE = re.compile(r"[0-9]{1,18}\Z")  # ASCII digits only: "١" and "²" are not versions
MAX_NAME = 128


#: a model name never ends like a bundle file's (``sources.BUNDLE_SUFFIXES``): what a user types
#: is then a ref or a file by its text alone, never by what exists on disk
_FILE_SUFFIXES = (".pt2b", ".pt2", ".zip")


def validate_name(name: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or not NAME_RE.match(name) \
            or ".." in name:
        raise UsageError(
            f"invalid model name {name!r}",
            hint="use lowercase letters, digits, '-', '_', '.' and '/' (team/model), at most 128 chars",
        )
    if name.endswith(_FILE_SUFFIXES):
        raise UsageError(f"invalid model name {name!r}: it ends like a bundle file ({name.rsplit('.', 1)[1]})",
                         hint="a model name may not end in .pt2b, .pt2 or .zip (those name files)")
    return name


def validate_alias(alias: str) -> str:
    if not isinstance(alias, str) or alias.isdecimal() or alias.startswith("sha256") \
            or not ALIAS_RE.match(alias):
        raise UsageError(
            f"invalid alias {alias!r}",
            hint="an alias starts with a letter, is not all digits and not a digest (e.g. prod, staging)",
        )
    return alias


def validate_digest(digest: str) -> str:
    if not isinstance(digest, str) or not DIGEST_RE.match(digest):
        raise UsageError(f"invalid digest {digest!r}", hint="expected sha256:<64 lowercase hex>")
    return digest


def validate_digests(digests: Iterable[str]) -> list[str]:
    """``validate_digest`` of each, as one pass in C over all of them (a push asks about ten
    thousand chunk digests at once); the first bad one's error.

    >>> validate_digests(["sha256:" + "a" * 64])
    ['sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa']
    """
    out = list(digests)
    if set(map(type, out)) <= {str} and "".join(map(_PREFIX, out)) == "sha256:" * len(out) \
            and all_hex64(list(map(_HEX_PART, out))):
        return out
    for d in out:
        validate_digest(d)
    raise UsageError("invalid digests", hint="expected sha256:<64 lowercase hex>")  # pragma: no cover


_PREFIX, _HEX_PART = operator.itemgetter(slice(0, 7)), operator.itemgetter(slice(7, None))


@dataclass(frozen=True)
class Ref:
    """A parsed reference to a model version. Exactly one of version/alias/digest or none."""

    name: str
    version: int | None = None
    alias: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Ref:
        if not isinstance(text, str) or not text.strip():
            raise UsageError("empty ref", hint="expected NAME, NAME@N, NAME@ALIAS or NAME@sha256:HEX")
        text = text.strip()
        name, sep, sel = text.partition("@")
        validate_name(name)
        if not sep:
            return cls(name)
        if not sel:
            raise UsageError(f"invalid ref {text!r}: nothing after '@'",
                             hint="expected NAME@N, NAME@ALIAS or NAME@sha256:HEX")
        if sel.startswith("sha256:"):
            return cls(name, digest=validate_digest(sel))
        if _VERSION_RE.match(sel):
            n = int(sel)
            if n < 1:
                raise UsageError(f"invalid ref {text!r}: versions start at 1")
            if sel.startswith("0"):
                raise UsageError(f"invalid ref {text!r}: write versions without leading zeros")
            return cls(name, version=n)
        if sel[0].isdigit():  # "١", "²", "12x", 19 digits: not a version, and not an alias either
            raise UsageError(f"invalid ref {text!r}: a version is 1 to 18 ASCII digits",
                             hint="expected NAME@N, NAME@ALIAS or NAME@sha256:HEX")
        return cls(name, alias=validate_alias(sel))

    @property
    def is_pinned(self) -> bool:
        """True when the ref names immutable content (a digest)."""
        return self.digest is not None

    @property
    def is_latest(self) -> bool:
        return self.version is None and self.alias is None and self.digest is None

    def __str__(self) -> str:
        if self.version is not None:
            return f"{self.name}@{self.version}"
        if self.alias is not None:
            return f"{self.name}@{self.alias}"
        if self.digest is not None:
            return f"{self.name}@{self.digest}"
        return self.name
