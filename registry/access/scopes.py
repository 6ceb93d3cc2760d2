"""Scopes: what a token may do, and the glob that picks the models it may do it to.

Grammar (one scope per ``--scope``)::

    model:<glob>:<action>[,<action>...]   actions: pull, push, alias, yank, delete, attest
    audit:read                            read, verify and export the audit log
    admin                                 everything, including tokens and gc

A ``<glob>`` is matched against whole model names, segment by segment (segments are split
at ``/``): ``*`` matches any run of characters within one segment, ``**`` (a whole segment)
matches any number of segments; a trailing ``/**`` needs at least one, so ``team/**`` is
everything under ``team/`` but not ``team`` itself::

    >>> glob_matches("team/*", "team/bert"), glob_matches("team/*", "team2/x")
    (True, False)
    >>> glob_matches("team/*", "team/a/b"), glob_matches("team/**", "team/a/b")
    (False, True)
    >>> parse_scope("model:team/*:push,pull").text
    'model:team/*:pull,push'
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache

from ..errors import AccessDeniedError, UsageError

__all__ = ["ACTIONS", "SCOPE_GRAMMAR", "Scope", "Identity", "glob_matches", "parse_scope",
           "validate_glob"]

ACTIONS = ("pull", "push", "alias", "yank", "delete", "attest")
AUDIT_READ = "audit:read"
ADMIN = "admin"
SCOPE_GRAMMAR = ("a scope is model:<glob>:<actions> (actions from pull,push,alias,yank,delete,attest, "
                 "comma-separated; glob like team/* or team/**), audit:read, or admin")

# a glob segment: the characters of a model name plus '*'
_SEGMENT_RE = re.compile(r"[a-z0-9_.\-*]+\Z")
MAX_GLOB = 128


def validate_glob(glob: str) -> str:
    """``glob`` if it is a well-formed model glob, else UsageError."""
    problem = None
    if not isinstance(glob, str) or not glob:
        problem = "it is empty"
    elif len(glob) > MAX_GLOB:
        problem = f"it is longer than {MAX_GLOB} characters"
    else:
        for seg in glob.split("/"):
            if not seg:
                problem = "it has an empty path segment"
            elif not _SEGMENT_RE.match(seg):
                problem = f"segment {seg!r} has characters a model name cannot have"
            elif "**" in seg and seg != "**":
                problem = f"'**' must be a whole segment, not part of {seg!r}"
            elif seg in (".", ".."):
                problem = f"segment {seg!r} is not allowed"
            if problem:
                break
    if problem:
        raise UsageError(f"invalid model glob {glob!r}: {problem}", hint=SCOPE_GRAMMAR)
    return glob


@lru_cache(maxsize=1024)
def _segment_re(seg: str) -> re.Pattern[str]:
    return re.compile("[^/]*".join(re.escape(part) for part in seg.split("*")) + r"\Z")


@lru_cache(maxsize=4096)
def glob_matches(glob: str, name: str) -> bool:
    """Whether model ``name`` matches ``glob``: ``*`` within one segment, ``**`` across them."""
    return _match(tuple(glob.split("/")), tuple(name.split("/")))


def _match(globs: tuple[str, ...], names: tuple[str, ...]) -> bool:
    if not globs:
        return not names
    head, rest = globs[0], globs[1:]
    if head == "**":
        least = 1 if not rest else 0  # a trailing '**' is "something inside", never nothing
        return any(_match(rest, names[skip:]) for skip in range(least, len(names) + 1))
    return bool(names) and _segment_re(head).match(names[0]) is not None \
        and _match(rest, names[1:])


@dataclass(frozen=True)
class Scope:
    """One parsed scope. ``text`` is its canonical spelling (actions in ACTIONS order)."""

    text: str
    kind: str  # "model" | "audit:read" | "admin"
    glob: str | None = None
    actions: frozenset[str] = frozenset()

    def covers(self, action: str, model: str | None) -> bool:
        if self.kind == ADMIN:
            return True
        if action in (ADMIN, AUDIT_READ):
            return self.kind == action
        if self.kind != "model" or action not in self.actions:
            return False
        return model is None or glob_matches(self.glob or "", model)


def parse_scope(text: str) -> Scope:
    """The :class:`Scope` of ``text``; UsageError naming the grammar when it is not one."""
    if not isinstance(text, str) or not text.strip():
        raise UsageError("empty scope", hint=SCOPE_GRAMMAR)
    text = text.strip()
    if text == ADMIN:
        return Scope(ADMIN, ADMIN)
    if text == AUDIT_READ:
        return Scope(AUDIT_READ, AUDIT_READ)
    kind, sep, rest = text.partition(":")
    glob, sep2, acts = rest.rpartition(":")
    if kind != "model" or not sep or not sep2:
        raise UsageError(f"invalid scope {text!r}", hint=SCOPE_GRAMMAR)
    validate_glob(glob)
    actions = [a.strip() for a in acts.split(",")]
    unknown = [a for a in actions if a not in ACTIONS]
    if unknown:
        raise UsageError(f"invalid scope {text!r}: unknown action {unknown[0]!r}", hint=SCOPE_GRAMMAR)
    ordered = [a for a in ACTIONS if a in actions]
    return Scope(f"model:{glob}:{','.join(ordered)}", "model", glob, frozenset(ordered))


@dataclass(frozen=True)
class Identity:
    """Who a request comes from: the authenticated token's id, owner, scopes and expiry."""

    token_id: int
    owner: str
    scopes: tuple[Scope, ...]
    expires_at: datetime | None = None

    @property
    def is_admin(self) -> bool:
        return any(s.kind == ADMIN for s in self.scopes)

    def allows(self, action: str, model: str | None = None) -> bool:
        """Whether this identity may do ``action`` (one of ACTIONS, ``audit:read``, ``admin``).

        A model action with ``model=None`` asks "on some model": any model scope granting it.
        ``admin`` implies every permission.
        """
        if action not in ACTIONS and action not in (AUDIT_READ, ADMIN):
            raise ValueError(f"unknown action {action!r}")
        return any(s.covers(action, model) for s in self.scopes)

    def require(self, action: str, model: str | None = None) -> None:
        """Return if :meth:`allows`, else AccessDeniedError naming the missing scope."""
        if self.allows(action, model):
            return
        if action in ACTIONS:
            missing = f"model:{model}:{action}" if model is not None else f"model:<glob>:{action}"
            what = f"scope {missing}" if model is not None else f"scope {missing} on any model"
        else:
            missing = action
            what = f"scope {missing}"
        raise AccessDeniedError(
            f"token {self.owner!r} (id {self.token_id}) lacks {what}",
            scope=missing, hint="ask an admin for a token with that scope (pt2reg token create)")
