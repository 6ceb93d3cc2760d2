"""The MLflow side of bench_mlflow.py, run by ``benchmarks/.venv-mlflow``'s Python.

    python _worker_mlflow.py MODE '{"db": ..., "artifacts": ..., "pt2": ..., "name": ..., "alias": ...}'
    python _worker_mlflow.py serve      # one "MODE JSON" per stdin line, one JSON line back

MODE: publish (log the .pt2 as a run artifact, register it, set the alias; ``artifacts`` is a
directory or an ``s3://`` URI), load (download ``models:/NAME@ALIAS`` and
``torch.export.load(...).module()``), populate (bulk-insert N versions of one model and an
alias into MLflow's own tables), resolve (p50/p95 of ``get_model_version_by_alias`` and
``get_model_version``), baseline, baseline-torch.
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
from _proc import peak_mib, serve
from mlflow import MlflowClient

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
        name = cfg.get("experiment", "bench")
        where = cfg["artifacts"] if "://" in cfg["artifacts"] else Path(cfg["artifacts"]).as_uri()
        exp = client.get_experiment_by_name(name)
        exp_id = exp.experiment_id if exp else client.create_experiment(name, artifact_location=where)
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
    elif mode == "populate":
        populate(client, uri, cfg["name"], int(cfg["versions"]), cfg["source"])
    elif mode == "resolve":
        info = resolve(client, cfg["name"], int(cfg["versions"]), int(cfg["calls"]))
    else:
        raise SystemExit(f"unknown mode {mode}")
    return {"seconds": time.perf_counter() - t0, "peak_mib": peak_mib(), **info}


def populate(client: MlflowClient, uri: str, name: str, versions: int, source: str) -> None:
    """``versions`` versions of ``name`` in one transaction through MLflow's own ORM tables
    (``create_model_version`` one by one would take hours), and alias ``prod`` on the middle one."""
    from mlflow.store.model_registry.dbmodels.models import SqlModelVersion
    from sqlalchemy import create_engine, insert

    client.create_registered_model(name)            # creates the schema and the model row
    engine = create_engine(uri)
    now = int(time.time() * 1000)
    with engine.begin() as conn:
        for start in range(1, versions + 1, 5000):
            conn.execute(insert(SqlModelVersion), [
                {"name": name, "version": n, "creation_time": now, "last_updated_time": now,
                 "source": source, "run_id": "0" * 32, "storage_location": source}
                for n in range(start, min(start + 5000, versions + 1))])
    engine.dispose()
    client.set_registered_model_alias(name, "prod", str(versions // 2))


def resolve(client: MlflowClient, name: str, versions: int, calls: int) -> dict:
    import statistics

    out = {}
    for kind, call in (("NAME@alias", lambda: client.get_model_version_by_alias(name, "prod")),
                       ("NAME@N", lambda: client.get_model_version(name, str(versions // 3)))):
        for _ in range(20):
            call()
        ms = []
        for _ in range(calls):
            t0 = time.perf_counter()
            call()
            ms.append((time.perf_counter() - t0) * 1000)
        out[kind] = {"p50": statistics.median(ms), "p95": statistics.quantiles(ms, n=20)[18]}
    return out


if __name__ == "__main__":
    serve(do)
