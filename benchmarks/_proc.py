"""What both benchmark workers share (``_worker_ours.py`` in our venv, ``_worker_mlflow.py`` in
MLflow's): the peak-memory reading and the command loop. Standard library only, since each
worker runs under its own interpreter; both import it from this folder (``sys.path[0]``).

    python _worker_X.py MODE 'JSON'     # one operation, one JSON line on stdout
    python _worker_X.py serve           # one "MODE JSON" per stdin line, one JSON line back
"""
from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path


def peak_mib() -> float:
    """This process's peak resident set (``VmHWM``) in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


def shared_mode(mode: str, cfg: dict) -> None:
    """The modes every worker of our venv shares, after its own: ``torch-load`` (the raw side:
    ``torch.export.load(...).module()``) and ``baseline*`` (nothing: the same imports)."""
    if mode == "torch-load":
        import torch

        torch.export.load(cfg["pt2"]).module()
    elif not mode.startswith("baseline"):
        raise SystemExit(f"unknown mode {mode}")


def serve(do: Callable[[str, dict], dict], argv: list[str] | None = None) -> None:
    """Run ``do(mode, config)`` once from the arguments, or for every stdin line with ``serve``."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[0] == "serve":
        for line in sys.stdin:
            mode, _, cfg = line.strip().partition(" ")
            print(json.dumps(do(mode, json.loads(cfg))), flush=True)
    else:
        print(json.dumps(do(argv[0], json.loads(argv[1]))))
