"""Who may do what: token secrets and their hashes, scopes, and the identity a token carries.

Pure values and functions (no IO); the store keeps tokens, the server asks an
:class:`~registry.access.scopes.Identity` before every route.
"""
from __future__ import annotations

from .scopes import ACTIONS, Identity, Scope, glob_matches, parse_scope, validate_glob
from .tokens import hash_secret, looks_like_token, new_secret, parse_expiry, validate_owner

__all__ = ["ACTIONS", "Identity", "Scope", "glob_matches", "parse_scope", "validate_glob",
           "hash_secret", "looks_like_token", "new_secret", "parse_expiry",
           "validate_owner"]
