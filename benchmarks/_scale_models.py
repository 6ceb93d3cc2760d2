"""The generated programs of ``bench_scale.py``: many tensors of mixed sizes, and a 2% fine-tune.

A program is a ``torch.nn.Module`` holding ``count`` parameters and buffers whose sizes sum to
``total_mib``: many small ones (1-64 KiB: biases, norms, running statistics), medium ones
(1-16 MiB), on programs of 1 GiB or more some large ones (32-128 MiB) and, when ``huge_mib`` is
set, exactly one huge embedding table. Its forward pass touches only a small head, so export is
quick, but every parameter and buffer is part of the exported state (checked after export).
The fine-tune is the same module with 2% of its tensors (chosen with a fixed seed) changed by a
small delta, as a merged LoRA adapter does, exported again.

The programs are generated once, in a child process (torch stays out of the caller), under
``benchmarks/out/models-scale/<name>-<size>m-<count>t-<key>/`` where ``key`` hashes this file, the spec and the
torch version: a change of the generator regenerates them.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

KiB, MiB = 1024, 1024 * 1024
HEAD = 64  # the forward pass: relu(head(x)) * scale, x: (2, HEAD)


@dataclass(frozen=True)
class Spec:
    name: str            # "big" or "many"
    total_mib: float     # bytes of all tensors (fp32)
    count: int           # number of tensors (parameters + buffers)
    huge_mib: float = 0  # one embedding table of this size (0: none)
    ft_percent: float = 2.0
    seed: int = 0

    def key(self, torch_version: str) -> str:
        h = hashlib.sha256(Path(__file__).read_bytes())
        h.update(json.dumps({**asdict(self), "torch": torch_version}, sort_keys=True).encode())
        return h.hexdigest()[:12]


@dataclass(frozen=True)
class Programs:
    dir: Path
    spec: Spec
    info: dict

    @property
    def base(self) -> Path:
        return self.dir / "base.pt2"

    @property
    def ft(self) -> Path:
        return self.dir / "ft.pt2"


def tensor_sizes(spec: Spec) -> list[int]:
    """Element counts (fp32) of every tensor, huge first; the sum is ``total_mib`` give or take
    rounding. Deterministic in ``spec.seed``."""
    rng = random.Random(spec.seed)
    total = int(spec.total_mib * MiB) // 4
    huge = int(spec.huge_mib * MiB) // 4
    n = spec.count - (1 if huge else 0) - 2  # the head's weight and scale are tensors too
    budget = total - huge - HEAD * HEAD - HEAD
    if n < 1 or budget <= 0:
        raise SystemExit(f"{spec.name}: {spec.count} tensors and {spec.huge_mib} MiB huge do not fit "
                         f"in {spec.total_mib} MiB")
    sizes: list[int] = []
    if budget * 4 >= 1024 * MiB:  # large tensors (32-128 MiB) hold ~35% of a program of 1 GiB or more
        while sum(sizes) < 0.35 * budget and len(sizes) < n // 4:
            sizes.append(rng.randint(32 * MiB, 128 * MiB) // 4 // 256 * 256)
    left, k = budget - sum(sizes), n - len(sizes)
    # small ones are log-uniform in 1-64 KiB (mean ~15 KiB); medium ones (log-uniform 1-16 MiB,
    # mean ~5.4 MiB) take what the small ones leave, rescaled to fill the budget exactly
    small_mean, medium_mean = 63 * KiB / math.log(64) / 4, 15 * MiB / math.log(16) / 4
    medium = max(1, min(k - 1, round((left - k * small_mean) / (medium_mean - small_mean))))
    small = [max(16, round(2 ** rng.uniform(10, 16) / 4)) for _ in range(k - medium)]
    if sum(small) > 0.8 * left:  # too many tensors for the size: smaller small ones
        shrink = 0.8 * left / sum(small)
        small = [max(16, int(s * shrink)) for s in small]
    draws = [2 ** rng.uniform(20, 24) / 4 for _ in range(medium)]
    scale = max(left - sum(small), 256 * medium) / sum(draws)
    mids = [max(256, int(d * scale) // 256 * 256) for d in draws]
    out = ([huge // 1024 * 1024] if huge else []) + sizes + mids + small
    rng.shuffle(out[1 if huge else 0:])  # mixed order in the module, huge first
    return out


def programs(spec: Spec, torch_version: str, root: Path) -> Programs:
    """Generate (once, cached) the base program and its fine-tune; returns their paths."""
    stem = f"{spec.name}-{spec.total_mib:g}m-{spec.count}t-"  # quick and full sizes cached side by side
    d = root / f"{stem}{spec.key(torch_version)}"
    info_path = d / "info.json"
    if info_path.is_file() and (d / "base.pt2").is_file() and (d / "ft.pt2").is_file():
        return Programs(d, spec, json.loads(info_path.read_text()))
    tmp = d.parent / f"{d.name}.incomplete-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    print(f"generating {spec.name}: {spec.total_mib:g} MiB in {spec.count} tensors -> {d} "
          "(once; cached)", file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); import _scale_models as m; "
            f"m._generate({json.dumps(asdict(spec))!r}, {str(tmp)!r})")
    done = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"generating the {spec.name} program failed ({done.returncode})")
    for old in root.glob(f"{stem}*"):  # an older generator's programs of this size
        if old != d and ".incomplete-" not in old.name:
            shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(d, ignore_errors=True)
    os.replace(tmp, d)
    print(f"generated {spec.name} in {time.perf_counter() - t0:.0f} s", file=sys.stderr, flush=True)
    return Programs(d, spec, json.loads(info_path.read_text()))


def _generate(spec_json: str, out: str) -> None:
    import torch

    spec = Spec(**json.loads(spec_json))
    sizes = tensor_sizes(spec)
    rng = random.Random(spec.seed + 1)

    class Scale(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.head = torch.nn.Linear(HEAD, HEAD, bias=False)
            self.scale = torch.nn.Parameter(torch.empty(HEAD))
            for i, n in enumerate(sizes):
                shape = (n // 1024, 1024) if i == 0 and spec.huge_mib else \
                    (n // 256, 256) if n >= 256 * 256 else (n,)
                t = torch.empty(shape)
                if len(shape) == 1 and rng.random() < 0.15:  # norm statistics: persistent buffers
                    self.register_buffer(f"b{i:05d}", t)
                else:
                    self.register_parameter(f"p{i:05d}", torch.nn.Parameter(t))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.head(x)) * self.scale

    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        model = Scale().eval()
        for t in model.state_dict().values():
            t.uniform_(-0.02, 0.02, generator=gen)
    example = (torch.zeros(2, HEAD),)
    o = Path(out)

    def export(path: Path) -> dict:
        t0 = time.perf_counter()
        ep = torch.export.export(model, example)
        state = {**ep.state_dict, **{k: v for k, v in ep.constants.items() if isinstance(v, torch.Tensor)}}
        want = model.state_dict()
        missing = sorted(set(want) - set(state))
        if missing:
            raise SystemExit(f"export dropped {len(missing)} tensors, e.g. {missing[:3]}")
        torch.export.save(ep, path)
        tensor_bytes = sum(v.numel() * v.element_size() for v in want.values())
        size = path.stat().st_size
        if size < tensor_bytes:
            raise SystemExit(f"{path.name}: {size} bytes on disk < {tensor_bytes} bytes of tensors")
        print(f"  {path.name}: {len(want)} tensors, {tensor_bytes / MiB:.1f} MiB of tensors, "
              f"{size / MiB:.1f} MiB file, {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        return {"tensors": len(want), "tensor_bytes": tensor_bytes, "file_bytes": size}

    base = export(o / "base.pt2")
    # the fine-tune: W + a small delta on ft_percent of the tensors (fixed seed), like a merged LoRA
    names = sorted(model.state_dict())
    k = max(1, round(len(names) * spec.ft_percent / 100))
    changed = sorted(random.Random(spec.seed + 2).sample(names, k))
    with torch.no_grad():
        state = model.state_dict()
        for name in changed:
            t = state[name]
            t.add_(torch.empty_like(t).uniform_(-1e-3, 1e-3, generator=gen))
    ft = export(o / "ft.pt2")
    changed_bytes = sum(model.state_dict()[n].numel() * 4 for n in changed)
    largest = max(sizes) * 4
    info = {"spec": asdict(spec), "torch": torch.__version__, "base": base, "ft": ft,
            "ft_changed_tensors": k, "ft_changed_bytes": changed_bytes,
            "largest_tensor_bytes": largest,
            "size_classes": {
                "small (<= 64 KiB)": sum(1 for s in sizes if s * 4 <= 64 * KiB),
                "medium (64 KiB - 32 MiB)": sum(1 for s in sizes if 64 * KiB < s * 4 < 32 * MiB),
                "large (32 - 256 MiB)": sum(1 for s in sizes if 32 * MiB <= s * 4 <= 256 * MiB),
                "huge (> 256 MiB)": sum(1 for s in sizes if s * 4 > 256 * MiB)}}
    (o / "info.json").write_text(json.dumps(info, indent=2) + "\n")
