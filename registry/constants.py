"""Environment variables, defaults and hard limits, in one place."""
from __future__ import annotations

import os
from pathlib import Path

__all__ = [
    "HEARTBEAT_SECONDS",
    "ENV_HOME", "ENV_DB", "ENV_STORE", "ENV_ACTOR", "ENV_URL", "ENV_TOKEN", "DEFAULT_HOME", "CREDENTIALS_FILE",
    "BUNDLE_FORMAT", "MANIFEST_MEMBER", "BUILD_MEMBER", "SIGNATURES_MEMBER", "DEFAULT_PROGRAM",
    "UNNAMED_PROGRAM_HINT",
    "MAX_MANIFEST_BYTES", "MAX_ENVELOPE_BYTES", "MAX_MEMBERS", "MAX_MEMBER_BYTES",
    "MAX_GRAPH_JSON_BYTES", "MAX_JSON_DEPTH", "MAX_JSON_CONTAINERS", "MAX_JSON_ITEMS", "CHUNK_SIZE",
    "ENV_S3_MULTIPART_THRESHOLD", "S3_MULTIPART_THRESHOLD", "s3_multipart_threshold",
]

#: the directory that holds the ``registry`` package: the repository root in a checkout (where
#: ``schema/`` and ``migrations/`` live), ``site-packages`` when installed. Modules use this
#: instead of counting ``parents`` of their own path, so moving a module cannot break it.
PACKAGE_PARENT = Path(__file__).resolve().parent.parent
VERSION = "0.1.0"  # the package version (pyproject.toml reads it from here)
ENV_HOME = "PT2REG_HOME"
ENV_DB = "PT2REG_DB"
ENV_STORE = "PT2REG_STORE"
ENV_ACTOR = "PT2REG_ACTOR"
#: a registry server to use instead of a database and a store (``--registry``)
ENV_URL = "PT2REG_URL"
#: the token for that server (else ``--token-file``, else ``pt2reg login``'s credentials file)
ENV_TOKEN = "PT2REG_TOKEN"
#: where ``pt2reg login`` keeps tokens, per server URL, under the home (mode 0600)
CREDENTIALS_FILE = "credentials.json"
DEFAULT_HOME = "~/.pt2reg"

#: Version of the bundle format this code writes and the highest it reads. Format 2: a chunked
#: member's integrity is its chunk list (no whole-member sha256); format 1 is still read.
BUNDLE_FORMAT = 2
#: Fixed member names of a .pt2b. Only manifest.json is part of the bundle's identity.
MANIFEST_MEMBER = "manifest.json"
BUILD_MEMBER = "build.json"
SIGNATURES_MEMBER = "signatures.json"
#: the name torch.export.save gives the program of a one-program ``.pt2``, which a bundled
#: ``PATH.pt2`` given without ``NAME=`` keeps: ``--sample model=...``, ``--dim model:...``
DEFAULT_PROGRAM = "model"
#: said wherever a program name is asked for (``--sample``, ``--dim``) and not found
UNNAMED_PROGRAM_HINT = (f'a PATH.pt2 given without NAME= keeps the name torch.export.save gave it, "{DEFAULT_PROGRAM}": '
                        f"--sample {DEFAULT_PROGRAM}=INPUTS.pt, --dim {DEFAULT_PROGRAM}:SYMBOL=NAME")

# Hostile-input limits: decided before anything is read in full.
MAX_MANIFEST_BYTES = 16 * 1024 * 1024
MAX_ENVELOPE_BYTES = 1024 * 1024
MAX_MEMBERS = 100_000
MAX_MEMBER_BYTES = 1 << 40  # 1 TiB
MAX_GRAPH_JSON_BYTES = 256 * 1024 * 1024
#: JSON values a graph may hold, counted before parsing: Python needs ~100 bytes per object,
#: so `[[],[],...]` (2 bytes each in the file) would otherwise cost 50x its size in memory.
#: Real graphs run ~33 bytes of JSON per object or array (a 13 kB graph holds 401).
MAX_JSON_CONTAINERS = 4_000_000
MAX_JSON_ITEMS = 32_000_000
MAX_JSON_DEPTH = 64

#: Streaming buffer for hashing and copying.
CHUNK_SIZE = 1024 * 1024

#: Blobs from this size up go to S3 as multipart uploads (parts of 8 MiB). The environment
#: variable, a number of bytes, overrides it: the tests lower it so that small bundles take the
#: multipart path (S3 still requires parts of at least 5 MiB).
ENV_S3_MULTIPART_THRESHOLD = "PT2REG_S3_MULTIPART_THRESHOLD"
S3_MULTIPART_THRESHOLD = 64 * 1024 * 1024


def s3_multipart_threshold() -> int:
    """The S3 multipart threshold in force: ``PT2REG_S3_MULTIPART_THRESHOLD`` bytes, else 64 MiB."""
    raw = os.environ.get(ENV_S3_MULTIPART_THRESHOLD, "").strip()
    if not raw:
        return S3_MULTIPART_THRESHOLD
    if not raw.isdigit() or int(raw) < 1:
        from .errors import UsageError

        raise UsageError(f"{ENV_S3_MULTIPART_THRESHOLD}={raw!r} is not a number of bytes",
                         hint=f"unset it, or give a size in bytes such as {S3_MULTIPART_THRESHOLD}")
    return int(raw)

#: how often a push refreshes its claim; gc treats a claim silent for 6 beats as dead
HEARTBEAT_SECONDS = 10.0
