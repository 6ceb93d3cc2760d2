"""The lazy ``torch`` import and its version floor; the environment of this torch; modules and
libraries imported for their operators; torch's own logging kept quiet."""
from __future__ import annotations

import contextlib
import importlib
import logging
import os
import platform
import re
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ...errors import IncompatibleError, UsageError

if TYPE_CHECKING:
    pass


__all__ = ['torch', 'check_torch_version', 'environment', 'import_modules', 'load_libraries', 'quiet_torch']


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
    """python/torch/platform/cuda of this process, without host or user (part of identity)."""
    env: dict[str, str | None] = {
        "python": platform.python_version(),
        "platform": f"{sys.platform}-{platform.machine()}",
        "torch": None,
        "cuda": None,
    }
    try:
        t = torch()
        env["torch"] = str(t.__version__)
        env["cuda"] = t.version.cuda
    except ImportError:
        pass
    return env
