"""Smoke-test `pt2reg compile` and `export-triton` on a real GPU (CI machines have none).

    python scripts/gpu_smoke_compile.py [--device cuda:0] [--keep DIR]
    python scripts/gpu_smoke_compile.py --device cpu      # the same steps on this CPU (slow)

Exports a small two-program model, bundles it with golden samples (computed on CPU), publishes
it in a throw-away registry, runs `pt2reg compile --device cuda:N` (compile for this GPU, run the
samples on the new variants, publish N+1), checks that the variant's recorded compute capability
is this device's, exports the Triton repository and checks `cc_model_filenames` maps the
device's "major.minor" to a file that `torch._inductor.aoti_load_package(..., "model")` loads
and runs to the golden outputs. Prints SKIP and exits 0 without CUDA; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--keep", metavar="DIR", help="work here and keep the files")
    args = ap.parse_args(argv)
    import torch

    on_cpu = args.device == "cpu"   # the same steps for this machine's CPU: checks the script itself
    if not on_cpu and not torch.cuda.is_available():
        print("SKIP: CUDA is not available")
        return 0
    work = Path(args.keep or tempfile.mkdtemp(prefix="pt2reg-gpu-compile-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        return _smoke(args, work, on_cpu)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


def _smoke(args: argparse.Namespace, work: Path, on_cpu: bool) -> int:
    import torch
    from torch.export import Dim, export

    from registry.bundler import bundle_exported_programs
    from registry.cli import main as cli_main

    os.environ["PT2REG_HOME"] = str(work / "home")
    torch.manual_seed(0)
    enc, dec = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.Tanh()), torch.nn.Linear(512, 640)
    batch = Dim("batch", min=1, max=64)
    x = torch.randn(3, 512)
    ds = {"encoder": {"input": {0: batch}}, "decoder": {"input": {0: batch}}}
    eps = {"encoder": export(enc, (x,), dynamic_shapes=ds["encoder"]),
           "decoder": export(dec, (x,), dynamic_shapes=ds["decoder"])}
    bundle_exported_programs(work / "m.pt2b", eps, dynamic_shapes=ds,
                             samples={"encoder": [(x,)], "decoder": [(x,)]})

    def run(*cli_args: str) -> str:
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            try:
                cli_main([str(a) for a in cli_args])
            except SystemExit as exc:
                if exc.code:
                    raise RuntimeError(f"pt2reg {' '.join(map(str, cli_args))} exited {exc.code}") from None
        return out.getvalue()

    run("push", work / "m.pt2b", "--name", "smoke/m")
    result = json.loads(run("compile", "smoke/m@1", "--device", args.device, "--json"))
    index = int(args.device.partition(":")[2] or 0)
    major, minor = torch.cuda.get_device_capability(index) if not on_cpu else (None, None)
    problems = []
    for v in result["variants"]:
        cc = v["target"].get("AOTI_COMPUTE_CAPABILITY") or None
        if cc != (f"{major}{minor}" if not on_cpu else None):
            problems.append(f"{v['program']}: variant {v['variant']} records compute capability {cc}, "
                            f"the device is {major}.{minor}")
    print(f"compiled {result['ref']}: " + ", ".join(f"{v['program']} -> {v['variant']} ({v['seconds']} s)"
                                                   for v in result["variants"]))
    print(f"store grew by {result['store_growth']['uploaded_bytes']} bytes "
          f"(variant members {result['store_growth']['variant_bytes']} bytes)")
    repo = work / "triton"
    run("export-triton", result["ref"], repo, "--trust-native")
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    for program, model in (("encoder", enc), ("decoder", dec)):
        cfg = text_format.Parse((repo / f"m_{program}" / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
        name = cfg.default_model_filename if on_cpu else cfg.cc_model_filenames.get(f"{major}.{minor}")
        if not name:
            problems.append(f"{program}: cc_model_filenames {dict(cfg.cc_model_filenames)} lacks {major}.{minor}")
            continue
        from torch._inductor.package import load_package  # as the backend: AOTIModelPackageLoader(path, "model")

        runner = load_package(str(repo / f"m_{program}" / "2" / name), "model", device_index=-1 if on_cpu else index)
        got = runner(x.to(args.device))
        got = got[0] if isinstance(got, (list, tuple)) else got
        if not torch.allclose(got.cpu(), model(x), rtol=1e-3, atol=1e-4):
            problems.append(f"{program}: the Triton file's output differs from eager")
    for p in problems:
        print(f"FAIL: {p}")
    if not problems:
        print(f"OK: variants for {'cpu' if on_cpu else f'sm_{major}{minor}'}"
              + (f", Triton repository at {repo}" if args.keep else ""))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
