"""Our side of an operation in its own process; prints {"peak_mib", "seconds"} as JSON.

    python _worker_ours.py MODE '{"home": ..., "db": ..., "store": ..., "bundle": ..., "ref": ...}'
    python _worker_ours.py serve        # one "MODE JSON" per stdin line, one JSON line back

MODE: baseline (the imports only), baseline-torch, push, pull, load (materialize + load_bundle,
what ``registry.load`` does), torch-load (``torch.export.load(...).module()``). Every mode
first imports the same modules, so peak - baseline is what the operation itself costs.
"""
from __future__ import annotations

import time

from _proc import peak_mib, serve, shared_mode

import registry.blobs.local  # noqa: F401
import registry.blobs.s3  # noqa: F401  (boto3, s3transfer)
import registry.client.api  # noqa: F401
import registry.format.bundle  # noqa: F401
import registry.store  # noqa: F401  (sqlalchemy, alembic)


def do(mode: str, cfg: dict) -> dict:
    if mode in ("load", "torch-load", "baseline-torch"):
        import torch  # noqa: F401  (a load needs torch; its baseline imports it too)

        import registry.runtime.loader  # noqa: F401
    from registry.client import Registry
    from registry.config import Settings

    def reg() -> Registry:
        return Registry(Settings.resolve(home=cfg["home"], db=cfg.get("db"), store=cfg.get("store"), env={}))

    t0 = time.perf_counter()
    if mode == "push":
        reg().push(cfg["bundle"], cfg["name"], aliases=cfg.get("aliases", "").split(",") if cfg.get("aliases") else ())
    elif mode == "pull":
        reg().pull(cfg["ref"], cfg["out"])
    elif mode == "load":
        from registry.runtime.loader import load_bundle

        load_bundle(reg().materialize(cfg["ref"]), device="cpu")
    else:
        shared_mode(mode, cfg)
    return {"peak_mib": peak_mib(), "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    serve(do)
