"""The exception tree of pt2-registry.

Every error a user can cause is a ``RegistryError`` carrying an ``exit_code`` from the CLI
contract and a one-line message that says what was wrong and what to do::

    RegistryError                      exit 1   anything else
    ├── UsageError                     exit 2   a bad argument value (bad ref, bad --meta ...)
    ├── NotFoundError (LookupError)    exit 3   model, version, alias, blob, file not found
    ├── IncompatibleError              exit 4   the bundle cannot run on the target
    │   └── UnsupportedFormatError              a bundle/manifest format newer than this reader
    ├── IntegrityError                 exit 5   digest mismatch, corrupt or hostile input
    │   ├── UnsafeArchiveError                  zip hygiene / pickle / size violations
    │   ├── ManifestError                       manifest not valid against the schema
    │   └── SignatureError                      missing or wrong signature
    ├── ConflictError                  exit 6   a state change lost a race or clashes
    ├── AccessDeniedError              exit 7   the token lacks the scope (HTTP 403)
    │   ├── NotAuthenticatedError               no, unknown, expired or revoked token (HTTP 401)
    │   └── PolicyError                         an alias policy refuses the change (HTTP 403)
    └── StoreError                     exit 1   a backend (database, S3) failed
        └── DatabaseOutdatedError               the database schema is behind head

Backend exceptions (SQLAlchemy, botocore) are translated at the store boundary with
``raise ... from exc`` so callers only ever catch these classes.
"""
from __future__ import annotations

__all__ = [
    "brief",
    "RegistryError",
    "UsageError",
    "NotFoundError",
    "IncompatibleError",
    "UnsupportedFormatError",
    "IntegrityError",
    "UnsafeArchiveError",
    "ManifestError",
    "SignatureError",
    "ConflictError",
    "AccessDeniedError",
    "NotAuthenticatedError",
    "PolicyError",
    "StoreError",
    "DatabaseOutdatedError",
    "InputValidationError",
]


def brief(exc: BaseException, limit: int = 300) -> str:
    """One short line for an exception raised by someone else's code (torch, boto3, ...):
    its first non-empty line, clipped; their messages can run to pages."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    text = " ".join((lines[0] if lines else type(exc).__name__).split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


class RegistryError(Exception):
    """Root of every error pt2-registry raises on purpose."""

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(message if not hint else f"{message} ({hint})")

    def one_line(self) -> str:
        text = self.message if not self.hint else f"{self.message}; {self.hint}"
        return " ".join(text.split())


class UsageError(RegistryError, ValueError):
    exit_code = 2


class NotFoundError(RegistryError, LookupError):
    exit_code = 3

    def __init__(self, message: str, *, what: str = "", name: str = "", hint: str | None = None):
        self.what = what
        self.name = name
        super().__init__(message, hint=hint)


class IncompatibleError(RegistryError):
    exit_code = 4

    def __init__(self, message: str, *, findings: list | None = None, hint: str | None = None):
        self.findings = list(findings or [])
        super().__init__(message, hint=hint)


class UnsupportedFormatError(IncompatibleError):
    pass


class IntegrityError(RegistryError):
    exit_code = 5

    def __init__(self, message: str, *, member: str | None = None, hint: str | None = None):
        self.member = member
        super().__init__(message, hint=hint)


class UnsafeArchiveError(IntegrityError):
    pass


class ManifestError(IntegrityError):
    def __init__(self, message: str, *, problems: list[str] | None = None, hint: str | None = None):
        self.problems = list(problems or [])
        super().__init__(message, hint=hint)


class SignatureError(IntegrityError):
    pass


class ConflictError(RegistryError):
    exit_code = 6


class AccessDeniedError(RegistryError):
    """The caller is authenticated but not permitted; ``scope`` names the missing scope."""

    exit_code = 7

    def __init__(self, message: str, *, scope: str | None = None, hint: str | None = None):
        self.scope = scope
        super().__init__(message, hint=hint)


class NotAuthenticatedError(AccessDeniedError):
    """No token, or an unknown, expired or revoked one."""


class PolicyError(AccessDeniedError):
    """An alias policy refuses a move or removal; ``rule`` names it (``signature``,
    ``attestation``, ``immutable``, ``role-scope``)."""

    def __init__(self, message: str, *, rule: str = "policy", hint: str | None = None,
                 scope: str | None = None):
        self.rule = rule
        super().__init__(message, scope=scope, hint=hint)


class StoreError(RegistryError):
    exit_code = 1


class DatabaseOutdatedError(StoreError):
    def __init__(self, message: str, *, current: str | None = None, head: str | None = None):
        self.current = current
        self.head = head
        super().__init__(message, hint="run `pt2reg db upgrade` to migrate it")


class InputValidationError(RegistryError, ValueError):
    """A call's inputs do not match a program's signature (raised before the graph runs)."""

    exit_code = 4

    def __init__(self, message: str, *, input_name: str | None = None, dim: int | None = None):
        self.input_name = input_name
        self.dim = dim
        super().__init__(message)
