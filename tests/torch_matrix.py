"""One side of the torch matrix's cross-version tests (``tests/integration/test_torch_matrix.py``).

Bundles made with one torch are verified and run with another: this module is what each side
does, in the test process for its own torch and as ``python -m tests.torch_matrix`` under the
other venv's interpreter (``.venv`` holds torch 2.13.0 CPU, ``.venv-torch2.14`` torch 2.14.1;
``bash scripts/setup-venv.sh torch2.14`` creates the second)::

    python -m tests.torch_matrix make OUT         export the models, bundle them into OUT (JSON: the bundles)
    python -m tests.torch_matrix make-uint32 OUT  a program whose window is 2.12, bundled (JSON)
    python -m tests.torch_matrix check BUNDLE...  verify and run --samples each (JSON: the results)

Both drive the ``pt2reg`` CLI in process (one interpreter start and torch import per side).
"""
from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: bundle name -> (program, sample inputs file or None) per program, from ``tests.make_models``'
#: exports: the translator (two programs, dynamic shapes, a dict output) and the graphs the red
#: team found mishandled (dunder ops, Pow sizes, guards, derived dims, constant inputs)
BUNDLES: dict[str, list[tuple[str, str | None]]] = {
    "translator": [("encoder", "encoder_inputs.pt"), ("decoder", "decoder_inputs.pt")],
    "heldout": [("masked", "masked_inputs.pt"), ("flat", "flat_inputs.pt"), ("guarded", "guarded_inputs.pt"),
                ("halves", None), ("flagged", "flagged_inputs.pt")],
}


def matrix_pythons() -> dict[str, Path]:
    """The torch matrix CI runs: the torch version of each venv -> its interpreter, for the
    venvs that exist (read from their ``torch-*.dist-info``, without importing torch)."""
    tiers = [".venv"] + [f".venv-{p.name[len('constraints-'):-len('.txt')]}"
                         for p in sorted(ROOT.glob("constraints-*.txt")) if p.name != "constraints-dev.txt"]
    found: dict[str, Path] = {}
    for venv in tiers:
        python = ROOT / venv / "bin" / "python"
        infos = sorted((ROOT / venv / "lib").glob("python*/site-packages/torch-*.dist-info"))
        m = re.match(r"torch-(.+)\.dist-info$", infos[-1].name) if infos else None
        if python.exists() and m:
            found[m.group(1)] = python
    return found


def bundle_exports(exports: Path, out: Path) -> dict[str, str]:
    """Bundle ``tests.make_models``' exports in ``exports`` into ``out`` (``pt2reg bundle``, with
    golden samples computed by this torch); name -> bundle path."""
    from tests.cli_inprocess import run_in_process

    made = {}
    for name, programs in BUNDLES.items():
        args: list[str] = [f"{p}={exports / p}.pt2" for p, _ in programs]
        args += [a for p, s in programs if s for a in ("--sample", f"{p}={exports / s}")]
        path = out / f"{name}.pt2b"
        r = run_in_process("bundle", *args, "-o", path, env={"PT2REG_HOME": str(out / "home")})
        if r.returncode != 0:
            raise RuntimeError(f"pt2reg bundle {name}: exit {r.returncode}: {r.stderr}")
        made[name] = str(path)
    return made


def check(bundles: list[str], home: Path) -> list[dict[str, Any]]:
    """``pt2reg verify --json`` and ``pt2reg run --samples --json`` of each bundle with this
    torch: one record per command (its exit code, parsed JSON or output, and this torch)."""
    import torch

    from tests.cli_inprocess import run_in_process

    results = []
    for bundle in bundles:
        for command in (("verify",), ("run", "--samples")):
            r = run_in_process(*command, bundle, "--json", env={"PT2REG_HOME": str(home)})
            try:
                doc = json.loads(r.stdout)
            except ValueError:
                doc = None
            results.append({"bundle": Path(bundle).stem, "command": " ".join(command), "exit_code": r.returncode,
                            "json": doc, "stderr": r.stderr[-2000:], "torch": str(torch.__version__)})
    return results


def make(out: Path) -> dict[str, Any]:
    """Export the models with this torch (``tests.make_models``, in this process: run it as
    ``python -m``, never import it into a test process) and bundle them."""
    import torch

    from tests import make_models

    exports = out / "exports"
    exports.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    make_models.export_translator(exports)
    make_models.export_heldout_shapes(exports)
    return {"torch": str(torch.__version__), "bundles": bundle_exports(exports, out)}


def make_uint32(out: Path) -> dict[str, Any]:
    """Export and bundle a program with a uint32 input (a dtype serde schema 8.20, torch 2.12,
    introduced: its window is 2.12) with this torch; ``bundle`` None where this torch cannot
    export one (2.10 and 2.11 cannot serialize uint32), with the error."""
    import torch

    from tests.cli_inprocess import run_in_process

    class ToFloat(torch.nn.Module):
        def forward(self, x):
            return x.to(torch.float32) * 2

    out.mkdir(parents=True, exist_ok=True)
    x = torch.tensor([1, 2, 3], dtype=torch.uint32)
    try:
        torch.export.save(torch.export.export(ToFloat(), (x,)), str(out / "uint32.pt2"))
    except Exception as exc:  # noqa: BLE001 - what this torch says, for the test to judge
        return {"torch": str(torch.__version__), "bundle": None, "error": f"{type(exc).__name__}: {exc}"}
    torch.save({"x": x}, out / "uint32_inputs.pt")
    path = out / "uint32.pt2b"
    r = run_in_process("bundle", f"main={out / 'uint32.pt2'}", "--sample", f"main={out / 'uint32_inputs.pt'}",
                       "-o", path, env={"PT2REG_HOME": str(out / "home")})
    if r.returncode != 0:
        raise RuntimeError(f"pt2reg bundle uint32: exit {r.returncode}: {r.stderr}")
    return {"torch": str(torch.__version__), "bundle": str(path), "error": None}


def main(argv: list[str]) -> None:
    os.environ.setdefault("PT2REG_SANDBOX", "off")  # as in the suite (tests/conftest.py)
    command, *rest = argv
    if command == "make":
        print(json.dumps(make(Path(rest[0]))))
    elif command == "make-uint32":
        print(json.dumps(make_uint32(Path(rest[0]))))
    elif command == "check":
        print(json.dumps(check(rest, Path(os.environ.get("PT2REG_HOME") or Path(rest[0]).parent / "home"))))
    else:
        raise SystemExit(f"usage: python -m tests.torch_matrix make OUT | make-uint32 OUT | check BUNDLE...: "
                         f"not {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
