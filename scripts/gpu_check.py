"""The GPU check: every GPU path of pt2-registry on this machine, as a user runs it, one JSON report.

    python scripts/gpu_check.py --device cuda:0 --report gpu_check.json     # on a GPU machine
    python scripts/gpu_check.py --device cpu [--quick]                      # the same steps here

Runs in a throw-away registry (nothing of the user's is read or written) and through the
command line, each step a process of its own (a crash in torch is a failed step, not a dead
check): capture the target; export on the device a torchvision-style CNN, a bfloat16 MLP, a
two-program model and programs calling custom ops with a CPU-only and with CPU+CUDA kernels;
bundle them with golden samples (computed on the device); push; verify for the device and for
the CPU; ``run --samples`` on the device (first run, with the sandbox, and a warm one) and on
the CPU; an input outside its Dim range; ``registry.load`` and a call with an input on the
wrong device; ``attest``; ``compile`` for the device, ``export-triton`` and loading the Triton
file as Triton's PyTorch backend does (``AOTIModelPackageLoader(path, "model")``); and the load
benchmark (``benchmarks/bench_gpu_load.py``). ``--quick`` (CI) leaves out compile, Triton and
the benchmark. Exit 0 when every step gave the outcome expected on this device, 1 otherwise.

On a lent GPU machine (its own torch, no network), carry the other dependencies as wheels
(docs/gpus.md): ``pip download`` them here for its Python, then there::

    pip install --no-index --no-deps --target .gpu-deps .gpu-wheels/*.whl
    PYTHONPATH=.gpu-deps:. python3 scripts/gpu_check.py --device cuda:0 --report $OUT/gpu_check.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: a module registering the custom ops the check exports (imported by every command via --import)
OPS_MODULE = '''
import torch

@torch.library.custom_op("gpucheck::scale_cpu_only", mutates_args=(), device_types="cpu")
def scale_cpu_only(x: torch.Tensor) -> torch.Tensor:
    return x * 2.0

@scale_cpu_only.register_fake
def _(x):
    return torch.empty_like(x)

@torch.library.custom_op("gpucheck::scale_both", mutates_args=(), device_types=("cpu", "cuda"))
def scale_both(x: torch.Tensor) -> torch.Tensor:
    return x * 3.0

@scale_both.register_fake
def _(x):
    return torch.empty_like(x)
'''

#: exports every model on the device (a process of its own): the fixtures' models, and two
#: calling the custom ops
EXPORT = '''
import sys, torch
sys.path.insert(0, {root!r}); sys.path.insert(0, {work!r} + "/modules")
import gpucheck_ops
from scripts.make_gpu_fixtures import write
device = {device!r}
write(__import__("pathlib").Path({work!r}), device)  # exported on the device for real
class OpModel(torch.nn.Module):
    def __init__(self, op):
        super().__init__(); self.lin = torch.nn.Linear(8, 8); self.op = op
    def forward(self, x):
        return self.op(self.lin(x))
for name, op in (("ops_cpu_only", torch.ops.gpucheck.scale_cpu_only), ("ops_both", torch.ops.gpucheck.scale_both)):
    torch.manual_seed(0)
    m, x = OpModel(op).eval(), torch.randn(4, 8)
    with torch.no_grad():
        expected = m(x) if name == "ops_both" or device == "cpu" else None
    ep = torch.export.export(m.to(device), (x.to(device),))
    torch.export.save(ep, {work!r} + f"/{{name}}.pt2")
    torch.save((x,), {work!r} + f"/{{name}}.inputs.pt")
print("exported")
'''

#: the Python API on the device: load by ref, call, and a call with an input on another device
API = '''
import sys, torch
sys.path.insert(0, {root!r})
import registry
from registry.errors import InputValidationError
bundle = registry.load("check/cnn@1", device={device!r})
assert str(bundle.device) == {device!r}, bundle.device
(x,) = torch.load({work!r} + "/cnn.inputs.pt", map_location="cpu")
(expected,) = torch.load({work!r} + "/cnn.expected.pt", map_location="cpu")
out = bundle(x.to({device!r}))
assert out.device == torch.device({device!r}), out.device
err = (out.float().cpu() - expected.float()).abs().max().item()
assert torch.allclose(out.float().cpu(), expected.float(), rtol=5e-3, atol=5e-3), err
other = "cpu" if {device!r} != "cpu" else "meta"
try:
    bundle(x.to(other))
except InputValidationError as exc:
    print(f"max abs error {{err:.3g}}; wrong device refused: {{exc}}")
else:
    raise SystemExit(f"an input on {{other}} was not refused")
'''

#: load a Triton repository's model file as Triton's PyTorch backend does (src/pt2/model_state.cc:
#: AOTIModelPackageLoader(path, "model")), run it, compare with eager
TRITON_LOAD = '''
import faulthandler, sys, torch
faulthandler.enable()
path, device = {path!r}, {device!r}
index = torch.device(device).index if device != "cpu" else -1
if device != "cpu":
    torch.cuda.init(); torch.cuda.set_device(index or 0); index = index or 0
from torch._inductor.package.package import AOTICompiledModel
runner = AOTICompiledModel(torch._C._aoti.AOTIModelPackageLoader(path, "model", False, 1, index))
(x,) = torch.load({work!r} + "/cnn.inputs.pt", map_location="cpu")
(expected,) = torch.load({work!r} + "/cnn.expected.pt", map_location="cpu")
got = runner(x.to(device))
got = got[0] if isinstance(got, (list, tuple)) else got
err = (got.float().cpu() - expected.float()).abs().max().item()
assert torch.allclose(got.float().cpu(), expected.float(), rtol=5e-3, atol=5e-3), err
print(f"the Triton file ran: max abs error {{err:.3g}}")
'''


@dataclass
class Step:
    name: str
    ok: bool
    exit_code: int | None
    seconds: float
    message: str
    expected: str = "exit 0"
    data: dict[str, Any] = field(default_factory=dict)
    stdout: str = field(default="", repr=False)   # what the command printed (not in the report)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.name, "ok": self.ok, "exit_code": self.exit_code, "seconds": round(self.seconds, 2),
                "expected": self.expected, "message": self.message, **({"data": self.data} if self.data else {})}


class Check:
    """The steps, their expected outcomes on ``device``, and the report."""

    def __init__(self, device: str, work: Path, quick: bool) -> None:
        self.device, self.work, self.quick = device, work, quick
        self.gpu = device != "cpu"
        self.home = work / "home"
        self.steps: list[Step] = []
        self.env = {**os.environ, "PT2REG_HOME": str(self.home), "PT2REG_SANDBOX": "on",
                    "PYTHONPATH": os.pathsep.join([str(ROOT), str(work / "modules"), os.environ.get("PYTHONPATH", "")]).rstrip(
                        os.pathsep), "PYTHONFAULTHANDLER": "1"}
        for key in ("PT2REG_DB", "PT2REG_STORE", "PT2REG_URL", "PT2REG_TOKEN", "PT2REG_TRUST"):
            self.env.pop(key, None)

    # -- running -------------------------------------------------------------------------------
    def _process(self, cmd: list[str], timeout: float) -> tuple[int | None, str, str, float]:
        t0 = time.monotonic()
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, env=self.env, cwd=self.work,
                                  stdin=subprocess.DEVNULL, timeout=timeout, errors="replace")
            return done.returncode, done.stdout, done.stderr, time.monotonic() - t0
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            return None, out, f"timed out after {timeout:g} s", time.monotonic() - t0

    def cli(self, name: str, *args: Any, expect: int = 0, needle: str = "", timeout: float = 600,
            check: Callable[[str], str | None] | None = None) -> Step:
        """``pt2reg ARGS`` as a process; ok when it exits ``expect`` (with ``needle`` in its
        error line) and ``check(stdout)`` finds nothing wrong."""
        cmd = [sys.executable, "-m", "registry.cli", *map(str, args)]
        rc, out, err, secs = self._process(cmd, timeout)
        last = next((ln for ln in reversed(err.strip().splitlines()) if ln.strip()), "")
        ok = rc == expect and needle in (last if expect else out + last)
        problem = check(out) if ok and check else None
        message = problem or (last if rc else _first_line(out)) or f"exit {rc}"
        step = Step(name, ok and problem is None, rc, secs, message,
                    f"exit {expect}" + (f" with {needle!r}" if needle else ""), stdout=out)
        if not step.ok:
            step.data["stderr"] = err[-4000:]
        return self._record(step)

    def python(self, name: str, code: str, timeout: float = 600, **data: Any) -> Step:
        rc, out, err, secs = self._process([sys.executable, "-c", code], timeout)
        tail = [ln for ln in (out + "\n" + err).strip().splitlines() if ln.strip()]
        message = tail[-1] if tail else f"exit {rc}"
        if rc != 0:
            data["stderr"] = err[-4000:]
        return self._record(Step(name, rc == 0, rc, secs, message, data=data))

    def _record(self, step: Step) -> Step:
        self.steps.append(step)
        print(f"[{'ok' if step.ok else 'FAIL'}] {step.name} ({step.seconds:.1f} s): {step.message}", flush=True)
        return step

    # -- the steps -----------------------------------------------------------------------------
    def run_all(self) -> None:
        dev, work = self.device, self.work
        (work / "modules").mkdir(exist_ok=True)
        (work / "modules" / "gpucheck_ops.py").write_text(OPS_MODULE)
        imp = ("--import", "gpucheck_ops")
        target = self.cli("target", "target", "--device", dev, "--json")
        if target.ok:
            (work / "target.json").write_text(target.stdout)
            target.data["target"] = {k: v for k, v in json.loads(target.stdout).items() if k != "custom_ops"}
        bare = self.python("import torch (for comparison with target)", "import torch")
        target.data["import_torch_seconds"] = round(bare.seconds, 2)
        if not self.python("export on the device", EXPORT.format(root=str(ROOT), work=str(work), device=dev)).ok:
            return
        # bundle with golden samples, computed on the device the programs were exported on
        models = {"cnn": ["cnn"], "mlp": ["mlp_bf16"], "encdec": ["encoder", "decoder"],
                  "ops-both": ["ops_both"], "ops-cpu-only": ["ops_cpu_only"]}
        if self.quick and not self.gpu:  # CI: tests/integration/test_gpu_exports.py covers those two
            del models["mlp"], models["encdec"]
        computed = dev.split(":")[0]
        for model, programs in models.items():
            args = [f"{p}={work / p}.pt2" for p in programs]
            samples = [] if model == "ops-cpu-only" and self.gpu else \
                [a for p in programs for a in ("--sample", f"{p}={work / p}.inputs.pt")]
            self.cli(f"bundle {model}", "bundle", *args, *samples, *imp, "-o", work / f"{model}.pt2b")
            if samples:
                self.cli(f"inspect {model}: samples computed on {computed}", "inspect", work / f"{model}.pt2b",
                         "--json", check=lambda out: _samples_on(out, computed))
            self.cli(f"push {model}", "push", work / f"{model}.pt2b", "--name", f"check/{model}")
        # verify for the device and for the CPU; the CPU-only op is refused for a GPU (exit 4)
        for model in models:
            cpu_only = model == "ops-cpu-only" and self.gpu
            self.cli(f"verify {model} for {dev}", "verify", f"check/{model}@1", "--device", dev, *imp,
                     expect=4 if cpu_only else 0, needle="has no CUDA kernel" if cpu_only else "")
            if self.gpu:
                self.cli(f"verify {model} for cpu", "verify", f"check/{model}@1", "--device", "cpu", *imp)
        # run the golden samples on the device: the first run (the sandbox checks it first), then warm
        first = self.cli(f"run --samples cnn on {dev} (first run)", "run", "check/cnn@1", "--samples",
                         "--device", dev, "--json", check=_samples_ok)
        warm = self.cli(f"run --samples cnn on {dev} (warm)", "run", "check/cnn@1", "--samples", "--device", dev,
                        "--json", check=_samples_ok)
        warm.data["first_over_warm"] = round(first.seconds / warm.seconds, 2) if warm.seconds else None
        for model in [m for m in ("mlp", "encdec", "ops-both") if m in models]:
            self.cli(f"run --samples {model} on {dev}", "run", f"check/{model}@1", "--samples", "--device", dev,
                     *imp, "--json", check=_samples_ok)
        if self.gpu:
            self.cli("run --samples cnn on cpu (computed on the GPU)", "run", "check/cnn@1", "--samples",
                     "--device", "cpu", "--json", check=_samples_ok)
            self.cli(f"run ops-cpu-only on {dev}: refused", "run", "check/ops-cpu-only@1", "--inputs",
                     work / "ops_cpu_only.inputs.pt", "--device", dev, *imp, expect=4, needle="has no CUDA kernel")
        self.cli("run ops-cpu-only on cpu", "run", "check/ops-cpu-only@1", "--inputs",
                 work / "ops_cpu_only.inputs.pt", "--device", "cpu", *imp, "--json")
        # an input outside its Dim range: exit 4 naming the input, the dim and the range
        self.python("write an out-of-range input", textwrap.dedent(f"""
            import torch
            torch.save((torch.randn(17, 3, 16, 16),), {str(work / 'batch17.pt')!r})"""))
        self.cli("run cnn with batch 17 (allowed 1..16)", "run", "check/cnn@1", "--inputs", work / "batch17.pt",
                 "--device", dev, expect=4, needle="allowed 1..16")
        self.python(f"registry.load on {dev} and a wrong-device input",
                    API.format(root=str(ROOT), work=str(work), device=dev))
        self.cli(f"attest cnn on {dev}", "attest", "check/cnn@1", "--label", "gpu-check", "--device", dev, "--json",
                 check=lambda out: None if json.loads(out)["attestation"]["passed"] else "the attestation did not pass")
        if self.quick:
            return
        self._compile_and_triton()
        self._benchmark()

    def _compile_and_triton(self) -> None:
        dev, work = self.device, self.work
        step = self.cli(f"compile cnn for {dev}", "compile", "check/cnn@1", "--program", "cnn", "--device", dev,
                        "--json", timeout=900)
        if not step.ok:
            if self.gpu and "crash" in step.message:
                self._diagnose_aoti()
            return
        result = json.loads(step.stdout)
        step.data.update(variants=result["variants"], store_growth=result["store_growth"])
        repo = work / "model-repository"  # not "triton": the processes here must import torch's triton
        if not self.cli("export-triton", "export-triton", result["ref"], repo, "--trust-native").ok:
            return
        config = next(repo.glob("*/config.pbtxt"))
        name = _model_file(config.read_text(), self._cc())
        path = next(config.parent.glob(f"*/{name}"))
        self.python("load the Triton file as Triton's backend does",
                    TRITON_LOAD.format(path=str(path), device=dev, work=str(work)))

    def _cc(self) -> str | None:
        if not self.gpu:
            return None
        import torch

        major, minor = torch.cuda.get_device_capability(torch.device(self.device))
        return f"{major}.{minor}"

    def _diagnose_aoti(self) -> None:
        """torch's AOTInductor loader crashed: the variants of scripts/gpu_aoti_diagnose.py,
        each in a process of its own, to say which step of the load crashes."""
        self.python("diagnose the AOTInductor load", f"import runpy, sys; sys.argv = ['d', {str(self.work / 'aoti')!r}]; "
                    f"runpy.run_path({str(ROOT / 'scripts' / 'gpu_aoti_diagnose.py')!r}, run_name='__main__')",
                    timeout=900)

    def _benchmark(self) -> None:
        out = self.work / "bench_gpu_load.json"
        sizes = "1G" if self.gpu else "64M"
        rc, stdout, err, secs = self._process([sys.executable, str(ROOT / "benchmarks" / "bench_gpu_load.py"),
                                               "--device", self.device, "--sizes", sizes, "--reps", "3",
                                               "--json", str(out)], 900)
        data: dict[str, Any] = {}
        message = (err.strip().splitlines() or [f"exit {rc}"])[-1]
        if rc == 0 and out.is_file():
            doc = json.loads(out.read_text())
            data = {"rows": [{k: r[k] for k in ("metric", "ours", "raw", "ratio")} for r in doc["rows"]],
                    "gpu": doc.get("gpu")}
            head = doc["rows"][0]
            message = f"{head['metric']}: ours {head['ours']:.3f} s, torch {head['raw']:.3f} s ({head['ratio']:.2f}x)"
        self._record(Step(f"load benchmark ({sizes} on {self.device})", rc == 0, rc, secs, message, data=data))

    def report(self) -> dict[str, Any]:
        import torch

        gpu = torch.cuda.get_device_name(torch.device(self.device)) if self.gpu and torch.cuda.is_available() else None
        failed = [s.name for s in self.steps if not s.ok]
        return {"device": self.device, "gpu": gpu, "compute_capability": self._cc() if gpu else None,
                "torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
                "platform": platform.platform(), "quick": self.quick, "at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "passed": not failed, "failed": failed, "seconds": round(sum(s.seconds for s in self.steps), 1),
                "steps": [s.to_json() for s in self.steps]}


def _first_line(text: str) -> str:
    return next((ln.strip() for ln in text.splitlines() if ln.strip()), "")


def _samples_on(out: str, device_type: str) -> str | None:
    devices = {s.get("device") for s in json.loads(out).get("samples", [])}
    return None if devices == {device_type} else f"samples recorded as computed on {sorted(map(str, devices))}"


def _samples_ok(out: str) -> str | None:
    doc = json.loads(out)
    if not doc.get("ok") or not doc.get("samples"):
        return "a golden sample failed or none ran"
    compared = [o for s in doc["samples"] for o in s["outputs"]]
    return None if compared and all(o.get("ok") for o in compared) else "no output was compared"


def _model_file(config: str, cc: str | None) -> str:
    """The file Triton core picks: ``cc_model_filenames["<major>.<minor>"]``, else the default."""
    if cc:
        m = re.search(r'cc_model_filenames\s*\{\s*key:\s*"' + re.escape(cc) + r'"\s*value:\s*"([^"]+)"', config)
        if m:
            return m.group(1)
    m = re.search(r'default_model_filename:\s*"([^"]+)"', config)
    return m.group(1) if m else "model.pt2"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda:0", help="cuda[:N] or cpu (default cuda:0)")
    p.add_argument("--quick", action="store_true", help="leave out compile, Triton and the benchmark (CI)")
    p.add_argument("--report", type=Path, default=None,
                   help="write the JSON report here (default: $OUT/gpu_check.json when OUT is set, else ./gpu_check.json)")
    p.add_argument("--keep", type=Path, help="work in this directory and keep it")
    a = p.parse_args(argv)
    from registry.runtime.device import Device

    device = str(Device.parse(a.device))
    import torch

    if device != "cpu" and not torch.cuda.is_available():
        print(f"error: {device} is not available here (torch {torch.__version__}); run with --device cpu",
              file=sys.stderr)
        return 2
    report_path = a.report or Path(os.environ.get("OUT") or ".") / "gpu_check.json"
    work = a.keep or Path(tempfile.mkdtemp(prefix="pt2reg-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    check = Check(device, work.resolve(), a.quick)
    started = time.monotonic()
    try:
        check.run_all()
    finally:
        doc = check.report()
        doc["wall_seconds"] = round(time.monotonic() - started, 1)
        report_path.parent.mkdir(parents=True, exist_ok=True)
        report_path.write_text(json.dumps(doc, indent=2) + "\n")
        print(f"{'PASSED' if doc['passed'] else 'FAILED: ' + ', '.join(doc['failed'])} on {device} "
              f"({doc['gpu'] or platform.processor() or 'cpu'}, torch {doc['torch']}, CUDA {doc['cuda']}) in "
              f"{doc['wall_seconds']} s; report {report_path}")
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
