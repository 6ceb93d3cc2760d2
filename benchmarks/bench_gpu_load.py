"""Loading onto the device: ``registry.load(ref, device=DEV)`` to the first output, against
``torch.export.load(f).module().to(DEV)`` of the same file, with a breakdown of each.

    python benchmarks/bench_gpu_load.py --device cuda:0 [--sizes 1G,8G] [--reps 5]
    python benchmarks/bench_gpu_load.py --device cpu --quick      # the smoke form (CI, no GPU)

Each repetition is a fresh process per side (ours and torch's alternating, the files in the
page cache), which loads twice: once fresh (``import torch`` and the device context, CUDA's,
reported apart) and once more after releasing the first (the warm load, every import and the
device's allocator ready: the headline figure). Each load reports, from the call to the first
output: deserialization, ``.module()``, the move to the device (host-to-device
copies), the first call (synchronized), and the total. Ours is a pinned digest ref already in
the client cache, so it reaches no database and no store; its breakdown is timed around the
adapter's functions (``torchrt.load_exported_program``, ``move_to_device``,
``restore_guards(...).module()``), and "checks" is the rest (trust, compatibility, vetting).
The program: a stack of ``Linear(W, W)`` layers in float32 (W = 4096, 64 MiB a layer) of the
size asked. Goal on a GPU (issue 40): ours at most 0.7x torch's path to the first output.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

from _common import PYTHON, REPO, Row, median, report, scratch  # noqa: E402

WIDTH = 4096
PHASES = ("import_torch", "device_context", "deserialize", "module", "to_device", "checks", "first_call", "total")


def _size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default=None, help="default: cuda:0 when available, else cpu")
    p.add_argument("--sizes", default=None, help="program sizes, e.g. 1G,8G (default: 1G,8G on a GPU, 256M on a CPU)")
    p.add_argument("--reps", type=int, default=None, help="fresh processes per side and size (default 5)")
    p.add_argument("--quick", action="store_true", help="a 16 MiB program, one repetition (smoke: figures meaningless)")
    p.add_argument("--json", dest="json_out", type=Path, help="also write the results here")
    p.add_argument("--worker", choices=("ours", "torch"), help=argparse.SUPPRESS)
    p.add_argument("--ref", help=argparse.SUPPRESS)
    p.add_argument("--pt2", help=argparse.SUPPRESS)
    p.add_argument("--width", type=int, default=WIDTH, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.reps is None:
        a.reps = 1 if a.quick else 5
    return a


# -- one load, in a fresh process ------------------------------------------------------------

def worker(a: argparse.Namespace) -> None:
    """Two loads in this fresh process: the first (imports, caches and the device's allocator
    still cold) and a second one once the first is released (everything warm)."""
    import gc

    t0 = time.perf_counter()
    import torch

    base = {"import_torch": time.perf_counter() - t0}
    dev = torch.device(a.device)
    t0 = time.perf_counter()
    if dev.type == "cuda":
        torch.cuda.init()
        torch.zeros(1, device=dev)
        torch.cuda.synchronize(dev)
    base["device_context"] = time.perf_counter() - t0
    loads = []
    for _ in range(2):
        loads.append({**base, **_load_once(a, torch, dev)})
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    print(json.dumps({"first": loads[0], "again": loads[1]}))


def _load_once(a: argparse.Namespace, torch, dev) -> dict[str, float]:
    times: dict[str, float] = {}
    x = torch.randn(8, a.width, device=dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    start = time.perf_counter()
    if a.worker == "torch":
        t0 = time.perf_counter()
        ep = torch.export.load(a.pt2)
        times["deserialize"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        module = ep.module()
        times["module"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        module = module.to(dev)
        sync()
        times["to_device"] = time.perf_counter() - t0
        times["checks"] = 0.0
        call = module
    else:
        call = _ours(a, dev, times, sync)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = call(x)
    sync()
    times["first_call"] = time.perf_counter() - t0
    times["total"] = time.perf_counter() - start
    assert out.shape == (8, a.width)
    return times


def _ours(a: argparse.Namespace, dev, times: dict, sync) -> object:
    import registry
    from registry.runtime import torchrt

    spent = {"deserialize": 0.0, "module": 0.0, "to_device": 0.0}
    real = {name: getattr(torchrt, name) for name in ("load_exported_program", "move_to_device", "restore_guards")}

    def timing(fn, key, after=None):
        def wrapped(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                result = fn(*args, **kwargs)
                if after:
                    after()
                return result
            finally:
                spent[key] += time.perf_counter() - t0
        return wrapped

    class _Timed:
        """``restore_guards(ep).module()``: the ``.module()`` part timed as torch's is."""

        def __init__(self, ep):
            self.ep = real["restore_guards"](ep)

        def module(self):
            return timing(self.ep.module, "module")()

    torchrt.load_exported_program = timing(real["load_exported_program"], "deserialize")
    torchrt.move_to_device = timing(real["move_to_device"], "to_device", sync)
    torchrt.restore_guards = _Timed
    try:
        t0 = time.perf_counter()
        bundle = registry.load(a.ref, device=str(dev))
        total = time.perf_counter() - t0
    finally:
        for name, fn in real.items():
            setattr(torchrt, name, fn)
    times.update(spent)
    times["checks"] = max(0.0, total - sum(spent.values()))
    return bundle


# -- the program and the runs ----------------------------------------------------------------

def _generate(work: Path, size: int, width: int) -> tuple[str, Path]:
    """A float32 Linear stack of ``size`` bytes, exported, saved, bundled and pushed into a
    registry under ``work/home``, its cache filled; (pinned ref, the .pt2 file)."""
    code = f"""
import sys, torch
sys.path.insert(0, {str(REPO)!r})
layers = max(1, {size} // ({width} * {width} * 4))
class Stack(torch.nn.Module):
    def __init__(s):
        super().__init__(); s.layers = torch.nn.ModuleList(torch.nn.Linear({width}, {width}) for _ in range(layers))
    def forward(s, x):
        for l in s.layers: x = torch.relu(l(x))
        return x
with torch.device("meta"):
    m = Stack()
m = m.to_empty(device="cpu").eval()
g = torch.Generator().manual_seed(0)
with torch.no_grad():
    for p in m.parameters(): p.uniform_(-0.02, 0.02, generator=g)
ep = torch.export.export(m, (torch.zeros(8, {width}),))
ep.example_inputs = None
torch.export.save(ep, {str(work / 'model.pt2')!r})
from registry.bundler import ProgramInput, build_bundle
from registry.client import Registry
from registry.config import Settings
build_bundle({str(work / 'model.pt2b')!r}, [ProgramInput("model", {str(work / 'model.pt2')!r})])
with Registry(Settings.resolve(home={str(work / 'home')!r}, env={{}})) as reg:
    pushed = reg.push({str(work / 'model.pt2b')!r}, "bench/gpu-load")
    ref = f"bench/gpu-load@{{pushed.version.digest}}"
    reg.materialize(ref)
print(ref)
"""
    done = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"generating the {size >> 20} MiB program failed:\n{done.stderr[-2000:]}")
    (work / "model.pt2b").unlink()
    return done.stdout.strip().splitlines()[-1], work / "model.pt2"


def _one(side: str, device: str, ref: str, pt2: Path, home: Path, width: int) -> dict[str, float]:
    env = {**os.environ, "PT2REG_HOME": str(home), "PYTHONPATH": os.pathsep.join(
        [str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep), "PT2REG_SANDBOX": "off"}
    env.pop("PT2REG_DB", None)
    env.pop("PT2REG_STORE", None)
    env.pop("PT2REG_URL", None)
    cmd = [PYTHON, __file__, "--worker", side, "--device", device, "--ref", ref, "--pt2", str(pt2),
           "--width", str(width)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {side} load failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    a = parse()
    if a.worker:
        worker(a)
        return
    import torch

    device = a.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    on_gpu = device.startswith("cuda")
    width = 512 if a.quick else WIDTH
    sizes = [_size(s) for s in (a.sizes or ("16M" if a.quick else "1G,8G" if on_gpu else "256M")).split(",")]
    rows, runs = [], {}
    for size in sizes:
        with scratch("gpu-load-") as work:
            ref, pt2 = _generate(work, size, width)
            _one("ours", device, ref, pt2, work / "home", width)  # warm-up: page cache, vetting verdicts
            _one("torch", device, ref, pt2, work / "home", width)
            got: dict[str, list[dict[str, dict[str, float]]]] = {"ours": [], "torch": []}
            for rep in range(a.reps):
                for side in (("ours", "torch") if rep % 2 == 0 else ("torch", "ours")):
                    got[side].append(_one(side, device, ref, pt2, work / "home", width))
        label = f"{size / (1 << 30):.2g} GiB" if size >= 1 << 30 else f"{size >> 20} MiB"
        med = {which: {side: {k: median([r[which][k] for r in got[side]]) for k in PHASES} for side in got}
               for which in ("again", "first")}
        runs[label] = {"runs": got, "medians": med}
        for which, title in (("again", "warm (a second load in the process)"),
                             ("first", "first load in a fresh process")):
            ours, theirs = med[which]["ours"]["total"], med[which]["torch"]["total"]
            headline = which == "again" and on_gpu
            rows.append(Row(f"{label} on {device}, {title}: load to first output", ours, theirs,
                            target="<= 0.7x" if headline else "", ok=(ours / theirs <= 0.7) if headline else None,
                            note="torch: export.load().module().to(dev)"))
            for phase in PHASES[:-1]:
                if which == "first" or phase not in ("import_torch", "device_context"):
                    rows.append(Row(f"  {phase.replace('_', ' ')}", med[which]["ours"][phase],
                                    med[which]["torch"][phase]))
    info = {"device": device, "torch": torch.__version__, "cuda": torch.version.cuda,
            "gpu": torch.cuda.get_device_name(torch.device(device)) if on_gpu else None, "runs": runs}
    path = report("gpu_load", f"Load onto {device} to the first output vs torch.export.load().module().to()",
                  rows, a, info)
    if a.json_out:
        a.json_out.parent.mkdir(parents=True, exist_ok=True)
        a.json_out.write_text(path.read_text())


if __name__ == "__main__":
    main()
