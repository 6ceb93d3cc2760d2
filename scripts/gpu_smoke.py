"""Smoke-test the real CUDA path of the loader (the CI machines have no GPU).

    python scripts/gpu_smoke.py [--device cuda:0] [--aoti] [--keep DIR]

Exports a tiny encoder with a dynamic batch and a ``device="cpu"`` baked into the graph (the
classic export-on-CPU bug), bundles it with a golden sample computed on CPU, verifies the bundle
against ``probe()`` of the GPU, loads it on the GPU (moving the baked device), runs the sample
and a real call, and checks that a too-long input is refused before the graph runs. ``--aoti``
also compiles an AOTInductor CUDA package and checks that it is the variant chosen here.
Prints SKIP and exits 0 when CUDA is absent; exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _model():
    import torch

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(64, 16)
            self.lin = torch.nn.Linear(16, 16)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            pos = torch.arange(tokens.shape[1], device="cpu")  # baked: must be moved to the GPU
            return torch.tanh(self.lin(self.emb(tokens) + pos.unsqueeze(-1)))

    return Encoder


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--aoti", action="store_true", help="also compile and check an AOTInductor CUDA variant")
    parser.add_argument("--keep", metavar="DIR", help="write the bundle here instead of a temp dir")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print(f"SKIP: CUDA is not available (torch {torch.__version__})")
        return 0
    from torch.export import Dim, export

    from registry.bundler import ProgramInput, SampleInput, build_bundle
    from registry.errors import InputValidationError
    from registry.runtime.loader import load_bundle, verify_bundle
    from registry.sources import materialize_file
    from registry.runtime.probe import probe
    from registry.runtime.torchrt import dim_names_of, save_exported_program

    work = Path(args.keep or tempfile.mkdtemp(prefix="pt2reg-gpu-smoke-"))
    work.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = _model()().eval()
    ds = {"tokens": {0: Dim("batch", min=1, max=32), 1: Dim("seq", min=2, max=64)}}
    example = torch.randint(0, 64, (2, 8))
    ep = export(model, (example,), dynamic_shapes=ds)
    save_exported_program(ep, work / "encoder.pt2")
    programs = [ProgramInput("encoder", work / "encoder.pt2", dim_names_of(ep, ds))]
    if args.aoti:
        started = time.monotonic()
        from torch.export.passes import move_to_device_pass

        gpu_ep = move_to_device_pass(export(model, (example,), dynamic_shapes=ds), args.device)
        torch._inductor.aoti_compile_and_package(gpu_ep, package_path=str(work / "encoder_cuda.pt2"))
        print(f"AOTInductor CUDA compile: {time.monotonic() - started:.1f} s")
        programs.append(ProgramInput("encoder", work / "encoder_cuda.pt2"))
    bundle_path = work / "smoke.pt2b"
    build_bundle(bundle_path, programs, samples=[SampleInput("encoder", (example,))], rtol=1e-3, atol=1e-4)
    src = materialize_file(bundle_path, work / "cache")

    failures: list[str] = []
    target = probe(args.device)
    print(f"target: torch {target.torch_version}, {target.device_type} sm_{target.compute_capability_str}, "
          f"CUDA {target.cuda_version or '-'} ROCm {target.rocm_version or '-'}")
    # --aoti means to run the compiled (native) variant: allowed explicitly, as a user would
    report = verify_bundle(src, device=args.device, target=target, trust_native=args.aoti)
    for f in report.findings:
        print(f"  {f.severity}: {f.code}: {f.message}")
    vid, why = report.choices["encoder"]
    print(f"variant: {vid} ({why})")
    if not report.compatible:
        failures.append("verify: not compatible")
    moved = torch.device(args.device).type != "cpu"
    if moved and not any(f.code == "baked-device" for f in report.findings):
        failures.append("verify: the baked cpu device was not reported")
    if args.aoti and not (vid or "").startswith("aoti-cuda"):
        failures.append(f"expected the AOTInductor CUDA variant, got {vid}")
    if not failures:
        bundle = load_bundle(src, device=args.device, target=target, trust_native=args.aoti)
        for r in bundle.run_samples():
            for o in r.outputs:
                print(f"  sample {r.name} output {o['output']}: max abs {o['max_abs']}, max rel {o['max_rel']}, "
                      f"{'ok' if o['ok'] else 'FAIL'}")
            if not r.ok:
                failures.append(f"sample {r.name}: {r.error or 'outside tolerance'}")
        real = torch.randint(0, 64, (5, 40))
        with torch.no_grad():
            expected = model(real)
        got = bundle["encoder"](real.to(args.device))
        if got.device.type != torch.device(args.device).type:
            failures.append(f"output is on {got.device}, expected {args.device}")
        elif not torch.allclose(got.cpu(), expected, rtol=1e-3, atol=1e-4):
            failures.append(f"real call differs from eager CPU: max abs {(got.cpu() - expected).abs().max():.3g}")
        try:
            bundle["encoder"](torch.randint(0, 64, (2, 100), device=args.device))
            failures.append("a too-long input was not refused")
        except InputValidationError as exc:
            print(f"  refused as expected: {exc}")
    for f in failures:
        print(f"FAIL: {f}")
    print("OK" if not failures else f"{len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
