"""Shared steps of the Hugging Face examples (``hf_causal_lm.py``, ``hf_encoder_decoder.py``).

- ``export_and_bundle``: torch.export each module with dynamic batch and sequence (``Dim``
  names), bundle them as named programs with golden samples, and write the example inputs and
  the eager outputs beside the bundle (used to check the pulled program). Imports transformers'
  models only through the modules it is given.
- ``publish_and_pull``: ``pt2reg push``, then ``pt2reg pull NAME@sha256:...`` (pinned).
- ``run_without_transformers``: a fresh ``python examples/hf_run.py`` process, which never
  imports transformers, loads the pulled bundle and compares each field with eager.

The tests (``tests/integration/test_hf_models.py``) call these same functions.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def _as_dict(out: Any) -> dict[str, Any]:
    """A ModelOutput (or any mapping) as a plain dict of its non-None fields."""
    return {k: v for k, v in dict(out.items()).items() if v is not None}


def export_and_bundle(out: str | os.PathLike, programs: Mapping[str, tuple[Any, dict, dict]], *,
                      metadata: Mapping[str, str] | None = None) -> Path:
    """``programs``: name -> (module, example kwargs, dynamic_shapes by kwarg name).

    Writes ``out`` (the .pt2b), ``out.inputs.pt`` ({program: kwargs}) and ``out.expected.pt``
    ({program: {field: eager tensor}}); returns the bundle path."""
    import torch
    from torch.export import export

    from registry import bundle_exported_programs

    out = Path(out)
    eps, shapes, samples, inputs, expected = {}, {}, {}, {}, {}
    for name, (module, kwargs, dynamic_shapes) in programs.items():
        module = module.eval()
        with torch.no_grad():
            expected[name] = _as_dict(module(**kwargs))
            eps[name] = export(module, (), kwargs, dynamic_shapes=dynamic_shapes, strict=False)
        shapes[name] = dynamic_shapes
        samples[name] = [dict(kwargs)]
        inputs[name] = dict(kwargs)
    bundle_exported_programs(out, eps, dynamic_shapes=shapes, samples=samples, metadata=dict(metadata or {}))
    torch.save(inputs, f"{out}.inputs.pt")
    torch.save(expected, f"{out}.expected.pt")
    return out


def pt2reg(home: str | os.PathLike, *args: str) -> str:
    """Run the ``pt2reg`` CLI (of this interpreter's environment) on registry ``home``."""
    cmd = [sys.executable, "-m", "registry.cli", "--home", str(home), *args]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"pt2reg {' '.join(args[:1])} failed ({done.returncode}): {done.stderr.strip()}")
    return done.stdout


def publish_and_pull(home: str | os.PathLike, bundle: str | os.PathLike, name: str,
                     cli: Callable[..., str] | None = None) -> tuple[str, Path]:
    """Push ``bundle`` as ``name``, pull it back pinned by digest; returns (pinned ref, file).
    ``cli(home, *args) -> stdout`` runs pt2reg (default: a subprocess)."""
    cli = cli or pt2reg
    pushed = json.loads(cli(home, "push", str(bundle), "--name", name, "--json"))
    ref = f"{name}@{pushed['digest']}"
    pulled = Path(f"{bundle}.pulled.pt2b")
    cli(home, "pull", ref, "-o", str(pulled))
    return ref, pulled


def run_without_transformers(home: str | os.PathLike, cases: Sequence[tuple[str, str | os.PathLike]],
                             chain: str | None = None) -> dict[str, Any]:
    """Run pulled bundles in one fresh process that never imports transformers (it checks).
    ``cases``: (pinned ref, the bundle file its ``.inputs.pt`` / ``.expected.pt`` lie beside).
    Returns hf_run.py's JSON report: per ref and program, output type, fields, max abs error."""
    cmd = [sys.executable, str(HERE / "hf_run.py"), "--home", str(home)]
    if chain:
        cmd += ["--chain", chain]
    for ref, bundle in cases:
        cmd += [ref, f"{bundle}.inputs.pt", f"{bundle}.expected.pt"]
    env = dict(os.environ)
    env["PYTHONPATH"] = str(HERE.parent) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"hf_run.py failed ({done.returncode}): {done.stdout[-2000:]} {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


def publish_pull_and_run(work: Path, bundle: Path, name: str, chain: str | None = None) -> dict[str, Any]:
    """An example's whole hand-off: publish ``bundle`` as ``name`` into ``work/home``, pull it
    pinned by digest, run it where transformers is never imported, and print the report."""
    ref, _pulled = publish_and_pull(work / "home", bundle, name)
    report = run_without_transformers(work / "home", [(ref, bundle)], chain=chain)
    print(json.dumps({"ref": ref, **report}, indent=2))
    return report
