"""The MLflow side of bench_mlflow.py, run by ``benchmarks/.venv-mlflow``'s Python.

    python _worker_mlflow.py MODE '{"db": ..., "artifacts": ..., "pt2": ..., "name": ..., "alias": ...}'
    python _worker_mlflow.py serve      # one "MODE JSON" per stdin line, one JSON line back

MODE: publish (log the .pt2 as a run artifact, register it, set the alias), load (download
``models:/NAME@ALIAS`` and ``torch.export.load(...).module()``), baseline, baseline-torch.
Prints {"seconds", "peak_mib", ...} as JSON; imports and set-up are outside ``seconds``.

Why an artifact and not ``mlflow.pytorch.log_model``: that flavor takes an ``nn.Module`` and
runs ``torch.export`` itself (``serialization_format="pt2"``); it accepts neither an
``ExportedProgram`` nor an existing ``.pt2``, so it cannot publish the program we measure.
"""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path

import mlflow
from mlflow import MlflowClient

from _proc import peak_mib, serve

warnings.filterwarnings("ignore")


def do(mode: str, cfg: dict) -> dict:
    if mode in ("load", "baseline-torch"):
        import torch
    if mode.startswith("baseline"):
        return {"seconds": 0.0, "peak_mib": peak_mib()}
    uri = f"sqlite:///{cfg['db']}"
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    client = MlflowClient()
    info: dict = {}
    t0 = time.perf_counter()
    if mode == "publish":
        exp = client.get_experiment_by_name("bench")
        exp_id = exp.experiment_id if exp else client.create_experiment(
            "bench", artifact_location=Path(cfg["artifacts"]).as_uri())
        with mlflow.start_run(experiment_id=exp_id) as run:
            mlflow.log_artifact(cfg["pt2"], artifact_path="model")
            source = mlflow.get_artifact_uri("model")
        # MLflow 3's register_model wants a logged *model* under runs:/; a plain artifact is
        # registered by its artifact URI (what register_model does underneath).
        if not client.search_registered_models(f"name = '{cfg['name']}'"):
            client.create_registered_model(cfg["name"])
        version = client.create_model_version(cfg["name"], source, run_id=run.info.run_id)
        client.set_registered_model_alias(cfg["name"], cfg["alias"], version.version)
        info["version"] = version.version
    elif mode == "load":
        path = mlflow.artifacts.download_artifacts(f"models:/{cfg['name']}@{cfg['alias']}",
                                                   dst_path=cfg["dest"])
        torch.export.load(os.path.join(path, Path(cfg["pt2"]).name)).module()
    else:
        raise SystemExit(f"unknown mode {mode}")
    return {"seconds": time.perf_counter() - t0, "peak_mib": peak_mib(), **info}


if __name__ == "__main__":
    serve(do)
