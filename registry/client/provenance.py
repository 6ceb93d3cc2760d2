"""Publishing with provenance: lineage edges, the publisher's environment and signatures.

    >>> publish(Registry(), "m.pt2b", "team/bert", parents=["team/base@3"],
    ...         datasets=["s3://data/wiki@sha256:ab..."], run_id="run-42")    # doctest: +SKIP
"""
from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from typing import Any, Callable, Sequence

from ..format.bundle import BundleFile
from ..errors import NotFoundError, UsageError
from ..refs import DIGEST_RE

__all__ = ["publish", "lineage_edges", "parse_dataset", "git_state", "publisher_environment"]

_SHA = re.compile(r"^[0-9a-fA-F]{7,64}$")


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


def lineage_edges(registry: Any, *, parents: Sequence[str] = (), datasets: Sequence[str] = (),
                  run_id: str | None = None, git_commit: str | None = None,
                  code_uri: str | None = None, detect_git: bool = True) -> list[dict[str, Any]]:
    edges: list[dict[str, Any]] = []
    for ref in parents:
        try:
            v = registry.resolve(ref)
        except NotFoundError as exc:  # say which option named it: push has many refs in play
            raise NotFoundError(f"parent {ref}: {exc.message}", what=exc.what, name=exc.name,
                                hint=exc.hint) from exc
        except UsageError as exc:
            raise UsageError(f"invalid --parent {ref!r}: {exc.message}", hint=exc.hint) from exc
        edges.append({"kind": "parent", "value": f"{v.name}@{v.number}", "digest": v.digest})
    for d in datasets:
        uri, digest = parse_dataset(d)
        edges.append({"kind": "dataset", "value": uri, "digest": digest})
    if run_id:
        edges.append({"kind": "run", "value": run_id})
    if git_commit:
        if not _SHA.match(git_commit):
            raise UsageError(f"invalid git commit {git_commit!r}", hint="expected a hex commit id")
        edges.append({"kind": "commit", "value": git_commit.lower()})
    elif detect_git:
        state = git_state()
        if state:
            edges.append({"kind": "commit", "value": state[0], "extra": {"dirty": state[1], "detected": True}})
    if code_uri:
        edges.append({"kind": "code", "value": code_uri})
    return edges


def publish(registry: Any, bundle_path: str | os.PathLike, name: str, *, aliases: Sequence[str] = (),
            parents: Sequence[str] = (), datasets: Sequence[str] = (), run_id: str | None = None,
            git_commit: str | None = None, code_uri: str | None = None,
            sign_key: str | os.PathLike | None = None, detect_git: bool = True,
            progress: Callable[[int], None] | None = None) -> Any:
    """Push a bundle with its lineage, environment and (optionally) a signature."""
    edges = lineage_edges(registry, parents=parents, datasets=datasets, run_id=run_id,
                          git_commit=git_commit, code_uri=code_uri, detect_git=detect_git)
    signatures = []
    if sign_key:
        from ..format.signing import sign_digest

        signatures.append(sign_digest(sign_key, BundleFile.open(bundle_path).digest))
    return registry.push(bundle_path, name, aliases=aliases, lineage=edges, signatures=signatures,
                         environment=publisher_environment(), progress=progress)
