"""OCI delivery: `pt2reg oci push` / `oci pull` of the 2 GiB, 1,000-tensor program against
`skopeo copy` of the same files, in one run, against a local OCI registry.

The program is bench_scale's "big" (``_scale_models.py``: ~2 GiB of fp32 in ~1,000 tensors, one
300 MiB table; generated once and cached), bundled and pushed into a local pt2reg registry
beforehand, and written as an OCI image layout (``pt2reg oci export``: the very blobs a push
sends). Side by side, the order rotated every repetition, medians of ``--reps``; every case a
whole command (a process: interpreter, imports and all), its input files and the code of our
side and skopeo's binary read once before it (``warm_files``, ``warm_code``: DAMON pages a
virtualenv out ~20 s after its last use on these machines) and the disk flushed after it
(``quiesce``):

push   ``pt2reg oci push bench@1 HOST/m:v1`` into an empty registry (a fresh CNCF distribution
       server per case and repetition, untimed start) vs ``skopeo copy oci:LAYOUT:v1
       docker://HOST/m:v1`` of the exported layout into another empty one.
pull   ``pt2reg oci pull HOST/m@sha256:... -o FILE`` into an empty home (cache) vs ``skopeo copy
       docker://HOST/m@sha256:... oci:DIR`` and then ``sync`` (the pull fsyncs the bundle it
       writes; skopeo does not), both from the same registry, filled once.

Goal: at most 1.2x skopeo for each.

    .venv/bin/python benchmarks/bench_oci.py              # 2 GiB, 3 repetitions
    .venv/bin/python benchmarks/bench_oci.py --quick      # 16 MiB, 1 repetition (smoke test)
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _scale_models as sm  # noqa: E402
from _common import CODE, OUT, Row, median, quiesce, report, scratch, warm_code, warm_files  # noqa: E402

PT2REG = str(Path(sys.executable).with_name("pt2reg"))
#: beyond ``CODE``: the OCI client's HTTP stack
OCI_CODE = ("httpx", "httpcore", "h11", "anyio", "sniffio", "certifi", "idna")


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--quick", action="store_true", help="16 MiB, one repetition (smoke test)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (default 3; quick 1)")
    p.add_argument("--big-mib", type=float, default=None, help="program size (default 2048; quick 16)")
    p.add_argument("--big-tensors", type=int, default=None, help="tensors (default 1000; quick 200)")
    p.add_argument("--huge-mib", type=float, default=None, help="its one huge tensor (default 300; quick 4)")
    a = p.parse_args()
    a.reps = a.reps or (1 if a.quick else 3)
    a.big_mib = a.big_mib or (16 if a.quick else 2048)
    a.big_tensors = a.big_tensors or (200 if a.quick else 1000)
    a.huge_mib = a.huge_mib if a.huge_mib is not None else (4 if a.quick else 300)
    return a


@contextlib.contextmanager
def registry_server() -> Iterator[str]:
    from tests.services_oci import oci_registry_server

    with oci_registry_server() as server:
        yield server.host


def run(cmd: list[str], env: dict[str, str]) -> None:
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stderr[-2000:]}")


def timed_case(setup: Callable[[], contextlib.AbstractContextManager[Callable[[], None]]],
               inputs: list[Path]) -> float:
    """``setup()`` (untimed) yields the command to time and cleans up after it (a registry
    stopped, its storage removed); inputs read first, the disk flushed after."""
    with setup() as go:
        warm_files(*inputs)
        warm_code(*CODE, *OCI_CODE)
        skopeo = shutil.which("skopeo")
        warm_files(*([Path(skopeo)] if skopeo else []))
        t0 = time.perf_counter()
        go()
        took = time.perf_counter() - t0
        quiesce()
    return took


def main() -> None:
    args = parse()
    spec = sm.Spec("big", args.big_mib, args.big_tensors, args.huge_mib)
    prog = sm.programs(spec, importlib.metadata.version("torch"), OUT / "models-scale")
    with scratch("oci-") as work, contextlib.ExitStack() as stack:
        env = {**os.environ, "PT2REG_HOME": str(work / "home"), "PT2REG_SANDBOX": "off"}
        for var in ("PT2REG_DB", "PT2REG_STORE", "PT2REG_URL", "PT2REG_TOKEN", "PT2REG_TRUST", "PT2REG_OCI_INSECURE"):
            env.pop(var, None)
        bundle = work / "big.pt2b"
        run([PT2REG, "bundle", str(prog.base), "-o", str(bundle)], env)
        run([PT2REG, "push", str(bundle), "--name", "bench"], env)
        layout = work / "layout"
        run([PT2REG, "oci", "export", "bench@1", str(layout), "--tag", "v1"], env)
        store = work / "home" / "store"
        source = stack.enter_context(registry_server())          # filled once: what both sides pull
        run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:v1", f"docker://{source}/m:v1"], env)
        digest = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--format", "{{.Digest}}",
                                 f"docker://{source}/m:v1"], capture_output=True, text=True).stdout.strip()
        if not digest.startswith("sha256:"):   # skopeo inspect refuses artifacts: ask for the raw manifest
            import hashlib

            raw = subprocess.run(["skopeo", "inspect", "--tls-verify=false", "--raw", f"docker://{source}/m:v1"],
                                 capture_output=True, check=True).stdout
            digest = "sha256:" + hashlib.sha256(raw).hexdigest()
        times: dict[str, list[float]] = {k: [] for k in ("ours push", "skopeo push", "ours pull", "skopeo pull")}

        @contextlib.contextmanager
        def push_ours() -> Iterator[Callable[[], None]]:
            with registry_server() as host:
                yield lambda: run([PT2REG, "oci", "push", "bench@1", f"{host}/m:v1"], env)

        @contextlib.contextmanager
        def push_skopeo() -> Iterator[Callable[[], None]]:
            with registry_server() as host:
                yield lambda: run(["skopeo", "copy", "--dest-tls-verify=false", f"oci:{layout}:v1",
                                   f"docker://{host}/m:v1"], env)

        @contextlib.contextmanager
        def pull_ours() -> Iterator[Callable[[], None]]:
            home, out = work / "pull-home", work / "pulled.pt2b"
            try:
                yield lambda: run([PT2REG, "--home", str(home), "oci", "pull", f"{source}/m@{digest}", "-o",
                                   str(out)], env)
            finally:
                shutil.rmtree(home, ignore_errors=True)
                out.unlink(missing_ok=True)

        @contextlib.contextmanager
        def pull_skopeo() -> Iterator[Callable[[], None]]:
            out = work / "skopeo-out"

            def go() -> None:
                run(["skopeo", "copy", "--src-tls-verify=false", f"docker://{source}/m@{digest}", f"oci:{out}:v1"], env)
                os.sync()
            try:
                yield go
            finally:
                shutil.rmtree(out, ignore_errors=True)

        cases = {"ours push": (push_ours, [store]), "skopeo push": (push_skopeo, [layout]),
                 "ours pull": (pull_ours, []), "skopeo pull": (pull_skopeo, [])}
        names = list(cases)
        for rep in range(args.reps):
            order = names[rep % len(names):] + names[:rep % len(names)]
            for name in order:
                setup, inputs = cases[name]
                times[name].append(timed_case(setup, [p for p in inputs if p.exists()]))
        size = bundle.stat().st_size
    rows = [Row("push 2 GiB x 1,000 tensors" if not args.quick else "push", median(times["ours push"]),
                median(times["skopeo push"]), target="<= 1.2x",
                note=f"pt2reg oci push vs skopeo copy oci:LAYOUT docker://; {size / 2**20:.0f} MiB"),
            Row("pull 2 GiB x 1,000 tensors" if not args.quick else "pull", median(times["ours pull"]),
                median(times["skopeo pull"]), target="<= 1.2x",
                note="pt2reg oci pull -o FILE (fsynced) vs skopeo copy docker:// oci:DIR + sync")]
    for r in rows:
        r.ok = None if args.quick else (r.ratio is not None and r.ratio <= 1.2)
    report("oci", "OCI delivery: pt2reg oci vs skopeo copy (whole commands, local registry)", rows,
           args, extra={"times": times, "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
                        "spec": {"mib": args.big_mib, "tensors": args.big_tensors, "huge_mib": args.huge_mib}})


if __name__ == "__main__":
    main()
