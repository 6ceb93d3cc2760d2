"""The lazy ``torch`` import and its version floor; the environment of this torch; modules and
libraries imported for their operators; torch's own logging kept quiet."""
from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import logging
import os
import platform
import re
import runpy
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from ...errors import IncompatibleError, UsageError

if TYPE_CHECKING:
    pass


__all__ = ['torch', 'check_torch_version', 'environment', 'installation_key', 'installed_version', 'import_modules', 'load_libraries', 'quiet_torch']


_torch_checked = False   # whether this process's torch passed ``check_torch_version``


def torch():  # noqa: D103 - the lazy import itself
    import torch as _torch

    global _torch_checked
    if not _torch_checked:
        check_torch_version(str(_torch.__version__))
        _torch_checked = True
    return _torch


def check_torch_version(version: str) -> None:
    """IncompatibleError (exit 4) for a torch older than the oldest supported release
    (``registry.pt2.window.FLOOR``, pyproject's ``torch>=``): its serializer and private APIs
    are not the ones this code reads, so it is refused in one line rather than half-working.
    A newer torch is allowed: the compatibility window decides per program, and the decoder
    fast paths fall back to torch's own code when its source differs."""
    from ...pt2.window import FLOOR, RELEASES

    m = re.match(r"^(\d+)\.(\d+)", version)
    if m is None:
        return  # a build without a version number: nothing to compare
    floor = tuple(int(p) for p in FLOOR.split("."))
    if (int(m.group(1)), int(m.group(2))) < floor:
        newest = max(RELEASES, key=lambda r: tuple(int(p) for p in r.split(".")))
        raise IncompatibleError(f"torch {version} is older than pt2-registry supports (torch {FLOOR} to {newest})",
                                hint=f"upgrade torch: pip install 'torch>={FLOOR}'")


def import_modules(modules: list[str] | tuple[str, ...]) -> None:
    """Import modules that register custom ops (``--import``)."""
    for mod in modules:
        try:
            importlib.import_module(mod)
        except Exception as exc:
            raise UsageError(f"cannot import {mod!r}: {type(exc).__name__}: {exc}",
                             hint="check the module name and that it is on PYTHONPATH") from exc


def load_libraries(paths: list[str] | tuple[str, ...]) -> None:
    """Load compiled custom-op libraries (``--load-library PATH.so``)."""
    for path in paths:
        if not os.path.isfile(path):
            raise UsageError(f"op library {path!r} not found")
        try:
            torch().ops.load_library(path)
        except Exception as exc:
            raise UsageError(f"cannot load op library {path!r}: {exc}") from exc


@contextlib.contextmanager
def quiet_torch() -> Iterator[None]:
    """Keep torch's deserialization warnings and log lines off the user's terminal: our own
    checks already said what matters, and a failure becomes one line of ours."""
    logger = logging.getLogger("torch")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logger.setLevel(level)


def environment() -> dict[str, str | None]:
    """python/torch/platform/cuda of this process, without host or user (part of identity).
    Read from torch's own ``version.py`` when torch is not imported yet (``installed_version``:
    the same strings, and a ``pt2reg bundle`` need not import torch for them), its floor checked."""
    env: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "torch": None,
        "cuda": None,
    }
    found = installed_version() if "torch" not in sys.modules else None
    if found is not None:
        check_torch_version(found[0])
        env["torch"], env["cuda"] = found
        return env
    try:
        t = torch()
        env["torch"] = str(t.__version__)
        env["cuda"] = t.version.cuda
    except ImportError:
        pass
    return env


def _torch_root() -> Path | None:
    """The installed torch package's folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.origin:
        return None
    return Path(spec.origin).parent


def installed_version() -> tuple[str, str | None] | None:
    """(``torch.__version__``, ``torch.version.cuda``) of the installed torch, read by running
    its ``version.py`` alone (generated at build time: constants only), not importing torch;
    None when there is none or it does not say."""
    root = _torch_root()
    if root is None or not (root / "version.py").is_file():
        return None
    try:
        values = runpy.run_path(str(root / "version.py"), run_name="_pt2reg_torch_version")
    except Exception:  # noqa: BLE001 - an unusual build: torch itself is asked instead
        return None
    version, cuda = values.get("__version__"), values.get("cuda")
    if not isinstance(version, str) or not (cuda is None or isinstance(cuda, str)):
        return None
    return version, cuda


def installation_key() -> str | None:
    """Names the installed torch without importing it: a digest of its package path, its
    ``version.py`` (version and git commit) and the identity (inode, size, mtime) of its
    compiled libraries. A reinstall, an upgrade or another environment gives another key;
    None when torch is not installed."""
    root = _torch_root()
    if root is None:
        return None
    h = hashlib.sha256(str(root).encode("utf-8", "surrogateescape"))
    try:
        h.update((root / "version.py").read_bytes())
    except OSError:
        return None
    for lib in sorted(p for pattern in ("lib/libtorch_cpu.*", "lib/torch_cpu.*", "_C.*") for p in root.glob(pattern)):
        try:
            st = lib.stat()
        except OSError:
            continue
        h.update(f"\n{lib.name} {st.st_ino} {st.st_size} {st.st_mtime_ns}".encode())
    return h.hexdigest()[:32]
