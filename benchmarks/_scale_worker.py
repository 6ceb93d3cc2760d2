"""One operation of ``bench_scale.py`` in a fresh process; prints {"peak_mib", "seconds"} as JSON.

    python _scale_worker.py MODE '{"home": ..., "db": ..., "store": ..., "cache": ..., ...}'

MODE: baseline (the registry's imports only), baseline-torch (those, torch, the bundler and the
loader), bundle (``build_bundle`` of ``pt2`` into ``out``, its vetting verdicts written to the
client cache ``cache`` when given, as ``pt2reg bundle`` does), push (``Registry.push``; the
cache is ``cache``, else the home's: without the bundler's verdicts the program check runs), pull
(``Registry.materialize`` into the empty cache ``cache``: what a load fetches), load
(``registry.load`` of ``ref`` with the empty cache ``cache``) and torch-load
(``torch.export.load(pt2).module()``). Every mode imports the same modules as its baseline first
(bundle, load and torch-load: baseline-torch), so peak - baseline is what the operation costs.
"""
from __future__ import annotations

import importlib
import os
import time

from _proc import peak_mib, serve, shared_mode

# what every mode imports first (the stores: sqlalchemy, alembic, boto3, s3transfer)
BASE_IMPORTS = ("registry.blobs.local", "registry.blobs.s3", "registry.client.api", "registry.format.bundle",
                "registry.store")
TORCH_IMPORTS = ("torch", "registry.bundler", "registry.runtime.loader")
TORCH_MODES = ("baseline-torch", "bundle", "load", "torch-load")
for _name in BASE_IMPORTS:
    importlib.import_module(_name)


def do(mode: str, cfg: dict) -> dict:
    for name in TORCH_IMPORTS if mode in TORCH_MODES else ():
        importlib.import_module(name)
    from registry.client import Registry
    from registry.config import Settings

    def reg() -> Registry:
        return Registry(Settings.resolve(home=cfg["home"], db=cfg.get("db"), store=cfg.get("store"), env={}),
                        cache_dir=cfg.get("cache"))

    t0 = time.perf_counter()
    if mode == "bundle":
        from registry.bundler import ProgramInput, build_bundle
        from registry.pt2.verdicts import verdicts_dir

        build_bundle(cfg["out"], [ProgramInput("model", cfg["pt2"])],
                     vetted_dir=verdicts_dir(cfg["cache"]) if cfg.get("cache") else None)
    elif mode == "push":
        with reg() as r:
            r.push(cfg["bundle"], cfg["name"])
    elif mode == "pull":
        with reg() as r:
            r.materialize(cfg["ref"])
    elif mode == "load":
        import registry

        os.environ["PT2REG_HOME"] = cfg["home"]
        for key, var in (("db", "PT2REG_DB"), ("store", "PT2REG_STORE")):
            if cfg.get(key):
                os.environ[var] = cfg[key]
        registry.load(cfg["ref"], device="cpu", cache_dir=cfg["cache"])
    else:
        shared_mode(mode, cfg)
    return {"peak_mib": peak_mib(), "seconds": time.perf_counter() - t0}


if __name__ == "__main__":
    serve(do)
