"""Where a version comes from: lineage edges, the publisher's environment, git state, build info.

``Registry.push`` records these with the version (one push API; see ``registry.client.push``):

    >>> reg.push("m.pt2b", "team/bert", parents=["team/base@3"],
    ...          datasets=["s3://data/wiki@sha256:ab..."], run_id="run-42")    # doctest: +SKIP
"""
from __future__ import annotations

import platform
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from ..config import actor, hostname
from ..errors import NotFoundError, UsageError
from ..refs import DIGEST_RE
from ..store.records import LineageEdge, VersionRecord

__all__ = ["lineage_edges", "parse_dataset", "git_state", "publisher_environment", "build_info"]

_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


def build_info() -> dict[str, Any]:
    """Who/when/where a bundle was built: informational, outside the bundle's identity."""
    from ..constants import VERSION

    return {"created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "created_by": actor(), "host": hostname(), "tool": f"pt2-registry {VERSION}"}


def parse_dataset(text: str) -> tuple[str, str | None]:
    """``URI[@sha256:HEX]`` -> (uri, digest or None)."""
    uri, sep, digest = text.rpartition("@sha256:")
    if not sep:
        uri, digest = text, None
    else:
        digest = "sha256:" + digest
        if not DIGEST_RE.match(digest):
            raise UsageError(f"invalid dataset digest in {text!r}", hint="expected URI@sha256:<64 hex>")
    if not uri.strip():
        raise UsageError(f"empty dataset URI in {text!r}", hint="expected URI[@sha256:<64 hex>]")
    return uri, digest


def git_state(cwd: str | None = None) -> tuple[str, bool] | None:
    """(HEAD commit, dirty) of the git repository around ``cwd``, or None."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                                capture_output=True, text=True, timeout=30)
        return head.stdout.strip(), bool(status.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        return None


def publisher_environment() -> dict[str, Any]:
    """python/torch/CUDA of the publishing process, without importing torch."""
    from importlib import metadata

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    cuda = None
    if "torch" in sys.modules:
        cuda = getattr(getattr(sys.modules["torch"], "version", None), "cuda", None)
    return {"python": platform.python_version(), "torch": torch_version, "cuda": cuda,
            "platform": f"{sys.platform}-{platform.machine()}"}


def lineage_edges(resolve: Callable[[str], VersionRecord], *, parents: Sequence[str] = (),
                  datasets: Sequence[str] = (), run_id: str | None = None, git_commit: str | None = None,
                  code_uri: str | None = None, detect_git: bool = True) -> list[LineageEdge]:
    """The lineage facts of a push; each parent ref is resolved (by ``resolve``) to the version
    it names now, so the edge pins its number and digest."""
    edges: list[LineageEdge] = []
    for ref in parents:
        try:
            v = resolve(ref)
        except NotFoundError as exc:  # say which option named it: push has many refs in play
            raise NotFoundError(f"parent {ref}: {exc.message}", what=exc.what, name=exc.name,
                                hint=exc.hint) from exc
        except UsageError as exc:
            raise UsageError(f"invalid --parent {ref!r}: {exc.message}", hint=exc.hint) from exc
        edges.append(LineageEdge("parent", f"{v.name}@{v.number}", v.digest))
    for d in datasets:
        uri, digest = parse_dataset(d)
        edges.append(LineageEdge("dataset", uri, digest))
    if run_id:
        edges.append(LineageEdge("run", run_id))
    if git_commit:
        if not _SHA.match(git_commit):
            raise UsageError(f"invalid git commit {git_commit!r}", hint="expected a hex commit id")
        edges.append(LineageEdge("commit", git_commit.lower()))
    elif detect_git:
        state = git_state()
        if state:
            edges.append(LineageEdge("commit", state[0], extra={"dirty": state[1], "detected": True}))
    if code_uri:
        edges.append(LineageEdge("code", code_uri))
    return edges
