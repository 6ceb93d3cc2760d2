"""Which step of loading an AOTInductor CUDA package crashes, when one does (issue 40).

    python scripts/gpu_aoti_diagnose.py OUTDIR          # on a GPU machine; gpu_check.py runs it
                                                        # when `pt2reg compile` crashes

torch 2.11's own loader was seen to crash (SIGSEGV) on freshly compiled, benign CUDA packages
(an H100, CUDA 13.0); reading torch's sources ruled out the package options, loading from a
buffer, the device index and an uninitialized CUDA context as *sole* causes, and no torch
issue matched. This runs the candidates apart, each in a process of its own with
``faulthandler`` and torch's native stack traces on, marking each step before it runs, so one
run on a GPU says where the crash is: two packages (a ``Linear`` built on CUDA with default
options; the registry's kind: an embedding model moved to CUDA, weights in a binary blob beside
the library), then loads by path, by buffer, with and without CUDA initialized first, through
``load_pt2`` (no silent fallback to the legacy loader), step by step (``dlopen`` the library,
the CUDA runner, the weights blob), and under ``RLIMIT_DATA`` as the sandbox sets it. Writes
``OUTDIR/<variant>.log`` and ``OUTDIR/summary.json``; prints one line per variant.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

PRELUDE = textwrap.dedent("""
    import faulthandler, glob, os, resource, sys, zipfile
    faulthandler.enable()
    import torch
    torch._C._set_print_stack_traces_on_fatal_signal(True)
    def mark(step):
        print("MARK", step, flush=True)
""")

COMPILE = PRELUDE + textwrap.dedent("""
    from torch.export import Dim, export
    from torch.export.passes import move_to_device_pass
    kind, path = sys.argv[1], sys.argv[2]
    class Enc(torch.nn.Module):
        def __init__(self):
            super().__init__(); self.emb = torch.nn.Embedding(64, 16); self.lin = torch.nn.Linear(16, 16)
        def forward(self, t):
            return torch.tanh(self.lin(self.emb(t) + torch.arange(t.shape[1], device=t.device).unsqueeze(-1)))
    torch.manual_seed(0)
    if kind == "linear":   # built on CUDA, static shapes, default options: the simplest package
        ep, options = export(torch.nn.Linear(16, 16).cuda().eval(), (torch.randn(4, 16, device="cuda"),)), {}
    else:                  # what `pt2reg compile` builds: moved to CUDA, weights in a blob beside the library
        ds = {"t": {0: Dim("b", min=1, max=32), 1: Dim("s", min=2, max=64)}}
        ep = move_to_device_pass(export(Enc().eval(), (torch.randint(0, 64, (2, 8)),), dynamic_shapes=ds), "cuda:0")
        options = {"aot_inductor.package_constants_in_so": False,
                   "aot_inductor.package_constants_on_disk_format": "binary_blob"}
    mark("compile")
    torch._inductor.aoti_compile_and_package(ep, package_path=path, inductor_configs=options)
    names = zipfile.ZipFile(path).namelist()
    cpp = [n for n in names if n.endswith(".cpp")]
    src = zipfile.ZipFile(path).read(cpp[0]).decode() if cpp else ""
    print("MEMBERS", len(names), "CPU_KERNELS", src.count("cpp_fused"), "CUDA_HOME",
          __import__("torch.utils.cpp_extension", fromlist=["x"]).CUDA_HOME)
""")

LOAD = PRELUDE + textwrap.dedent("""
    how, path = sys.argv[1], sys.argv[2]
    if "rlimit" in how:
        resource.setrlimit(resource.RLIMIT_DATA, (8 << 30, 8 << 30))
    if "init" in how:
        mark("cuda init"); torch.cuda.init(); torch.cuda.set_device(0); torch.zeros(1, device="cuda")
    index = 0 if "idx0" in how else -1
    if how.startswith("staged"):
        import ctypes, tempfile
        d = tempfile.mkdtemp(); zipfile.ZipFile(path).extractall(d)
        so = glob.glob(d + "/**/*.so", recursive=True)[0]
        blob = glob.glob(d + "/**/*.blob", recursive=True)
        mark("dlopen"); ctypes.CDLL(so, mode=os.RTLD_LOCAL | os.RTLD_NOW)
        mark("runner"); runner = torch._C._aoti.AOTIModelContainerRunnerCuda(so, 1, "cuda:0", os.path.dirname(so), False)
        if blob:
            mark("blob"); runner.update_constant_buffer_from_blob(blob[0])
    elif how.startswith("load_pt2"):
        from torch.export.pt2_archive._package import load_pt2
        mark("load_pt2"); runner = load_pt2(path, device_index=index).aoti_runners["model"]
    else:
        from torch._inductor.package import load_package
        source = open(path, "rb") if how.startswith("buffer") else path
        mark("load_package"); runner = load_package(source, "model", device_index=index)
    mark("loaded")
    x = torch.randint(0, 64, (5, 40), device="cuda") if "encoder" in path else torch.randn(4, 16, device="cuda")
    mark("run")
    y = runner(x) if callable(runner) else runner.run([x])
    torch.cuda.synchronize(); mark("ran")
    maps = open("/proc/self/maps").read()
    print("CUDA_LIBS", sorted({l.split()[-1] for l in maps.splitlines() if "libcudart" in l or "libcuda.so" in l}))
""")

#: (variant, how to load) tried on each package; the first is the loader the registry uses
LOADS = ("load_pt2_init_idx0", "path", "path_init_idx0", "buffer_idx0", "staged_init", "buffer_init_idx0_rlimit")


def _run(out: Path, name: str, code: str, *args: str, timeout: float = 600) -> dict:
    t0 = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=timeout,
                              errors="replace")
        rc, text = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        rc, text = None, f"timed out after {timeout} s: {exc}"
    (out / f"{name}.log").write_text(text)
    marks = [ln.split(" ", 1)[1] for ln in text.splitlines() if ln.startswith("MARK ")]
    facts = [ln for ln in text.splitlines() if ln.startswith(("MEMBERS", "CUDA_LIBS"))]
    row = {"variant": name, "exit_code": rc, "seconds": round(time.monotonic() - t0, 1),
           "last_step": marks[-1] if marks else None, "facts": facts,
           "tail": text.strip().splitlines()[-12:] if rc else []}
    print(f"{name}: exit {rc} after step {row['last_step']!r} ({row['seconds']} s) {' '.join(facts)}", flush=True)
    return row


def main(argv: list[str]) -> int:
    out = Path(argv[0] if argv else "aoti-diagnosis").resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = subprocess.run("nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; "
                         "nvcc --version 2>/dev/null | tail -1; gcc --version | head -1",
                         shell=True, capture_output=True, text=True).stdout.strip()
    rows = [{"variant": "environment", "facts": env.splitlines()}]
    print(env)
    packages = {"linear": out / "linear.pt2", "encoder": out / "encoder.pt2"}
    for kind, path in packages.items():
        rows.append(_run(out, f"compile-{kind}", COMPILE, kind, str(path), timeout=900))
    for kind, path in packages.items():
        for how in (LOADS if kind == "encoder" else LOADS[:2]):
            if path.is_file():
                rows.append(_run(out, f"{how}-{kind}", LOAD, how, str(path)))
    (out / "summary.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
