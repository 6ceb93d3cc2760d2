"""Defense in depth: torch deserializes an unknown program in a limited subprocess first.

The first time this machine loads a program whose bundle no trusted key signed, the loader runs
the same deserialization torch will run in-process (``torchrt.load_exported_program`` then
``restore_guards(...).module()``, or ``load_aoti`` for an allowed AOTInductor variant) in a child
``python -m registry.runtime.sandbox`` with an address-space limit (``RLIMIT_AS``; ``RLIMIT_DATA`` on a
CUDA/ROCm build of torch, whose driver reserves huge address ranges), a CPU-time limit
(``RLIMIT_CPU``), no core dumps and a wall-clock timeout; the new programs of one load share one
child, deserialized one after another, and the limits scale with their number and size. Only
when the child finishes cleanly is the program loaded in the caller's process, and the verdict
is remembered by the program member's sha256 (with the torch version) in
``HOME/cache/vetted/<hex>.json``, so later loads cost one small file read. A crash, an
exhausted limit or a torch error in the child is exit 5, one line, and the caller never
deserializes the program.

The child receives paths and names only, never pickles, and no flag wider than the caller's:
the modules and op libraries the caller imported (``--import``, ``--load-library``, and any
library already loaded into torch), and the AOTInductor path only when the caller already
chose that variant.

Settings (environment): ``PT2REG_SANDBOX`` = ``on`` (default) | ``off``;
``PT2REG_SANDBOX_MEMORY`` = address-space limit in bytes or with a K/M/G suffix (default 4 GiB
plus 3x the program files' size); ``PT2REG_SANDBOX_SECONDS`` = CPU and wall-clock limit per
program (default 120).

What it catches: a deserializer that crashes (segfault, abort), allocates without bound, or
spins. What it does not: an exploit that stays within the limits and behaves the same in the
parent; that is what the graph vetting and signatures are for.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..constants import PACKAGE_PARENT
from .device import Device, DeviceLike

__all__ = ["SandboxConfig", "vet_program", "vet_programs", "ENV_SANDBOX", "ENV_SANDBOX_MEMORY",
           "ENV_SANDBOX_SECONDS", "parse_size", "vetted_path"]

ENV_SANDBOX = "PT2REG_SANDBOX"
ENV_SANDBOX_MEMORY = "PT2REG_SANDBOX_MEMORY"
ENV_SANDBOX_SECONDS = "PT2REG_SANDBOX_SECONDS"
DEFAULT_SECONDS = 120.0
DEFAULT_MEMORY_BASE = 4 << 30
GiB = 1 << 30

# child exit codes
_RC_OK, _RC_OOM, _RC_ERROR, _RC_INCOMPATIBLE = 0, 3, 4, 6
_OK_LINE = "pt2reg-sandbox: ok"


def parse_size(text: str) -> int:
    """``4294967296``, ``4G``, ``512M``, ``1.5GiB`` -> bytes (UsageError otherwise)."""
    from ..errors import UsageError

    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(?:i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"{ENV_SANDBOX_MEMORY}={text!r} is not a size", hint="e.g. 8G, 512M or a byte count")
    value = float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " ")
    if value < 64 << 20:
        raise UsageError(f"{ENV_SANDBOX_MEMORY}={text!r} is below 64 MiB; torch cannot even start")
    return int(value)


@dataclass(frozen=True)
class SandboxConfig:
    enabled: bool
    vetted_dir: Path
    memory: int | None = None          # None: DEFAULT_MEMORY_BASE + 3x the program's size
    seconds: float = DEFAULT_SECONDS
    imports: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()

    @classmethod
    def from_env(cls, cache_dir: str | os.PathLike, env: Mapping[str, str] | None = None, *,
                 imports: Sequence[str] = (), libraries: Sequence[str] = ()) -> SandboxConfig:
        from ..errors import UsageError

        env = os.environ if env is None else env
        mode = (env.get(ENV_SANDBOX) or "on").strip().lower()
        if mode not in ("on", "off", "1", "0", "true", "false", "yes", "no"):
            raise UsageError(f"{ENV_SANDBOX}={mode!r}: expected on or off")
        memory = env.get(ENV_SANDBOX_MEMORY)
        seconds = env.get(ENV_SANDBOX_SECONDS)
        try:
            secs = float(seconds) if seconds else DEFAULT_SECONDS
        except ValueError:
            secs = -1.0
        if not secs > 0:
            raise UsageError(f"{ENV_SANDBOX_SECONDS}={seconds!r} is not a positive number of seconds")
        return cls(mode in ("on", "1", "true", "yes"), Path(cache_dir) / "vetted",
                   parse_size(memory) if memory else None, secs, tuple(imports), tuple(libraries))


def vetted_path(config: SandboxConfig, member_digest: str) -> Path:
    return config.vetted_dir / f"{member_digest.split(':', 1)[-1]}.json"


def _entry(kind: str, archive_name: str, device: Device) -> str:
    """What a verdict covers: a portable program is deserialized on the CPU whatever device it
    will run on (``torchrt.load_exported_program``), so one verdict serves every device; an
    AOTInductor package is loaded for its device type."""
    return f"{kind}:{archive_name}:{device.type}" if kind == "aoti" else f"{kind}:{archive_name}"


def _torch_version() -> str:
    from .torchrt import torch

    return str(torch().__version__)


def _verdicts(path: Path) -> dict[str, list[str]]:
    """torch version -> the entries vetted under it, from a verdict file (both layouts: the
    per-torch ``{"verdicts": {...}}``, and the older ``{"torch": V, "ok": [...]}``)."""
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(doc, dict):
        return {}
    found = doc.get("verdicts") if isinstance(doc.get("verdicts"), dict) else \
        ({doc["torch"]: doc.get("ok")} if isinstance(doc.get("torch"), str) else {})
    return {str(v): [e for e in entries if isinstance(e, str)] for v, entries in found.items()
            if isinstance(entries, list)}


def _is_vetted(path: Path, entry: str, torch_version: str) -> bool:
    return entry in _verdicts(path).get(torch_version, [])


def _remember(path: Path, entry: str, torch_version: str) -> None:
    """Add ``entry`` under ``torch_version``, keeping the verdicts of other torches: switching
    torch and back checks nothing again (one verdict per program and torch)."""
    from ..atomic import atomic_write

    verdicts = _verdicts(path)
    verdicts[torch_version] = sorted(set(verdicts.get(torch_version, [])) | {entry})
    try:
        with atomic_write(path, fsync=False) as f:
            f.write(json.dumps({"verdicts": verdicts}, sort_keys=True).encode("utf-8"))
    except OSError:
        pass  # a read-only home: the next load is vetted again


def _gpu_build() -> bool:
    from .torchrt import torch

    t = torch()
    return bool(getattr(t.version, "cuda", None) or getattr(t.version, "hip", None))


def _libraries(config: SandboxConfig) -> list[str]:
    """The caller's op libraries: those named, and those already loaded into torch."""
    libs = list(config.libraries)
    try:
        from .torchrt import torch

        libs += [p for p in sorted(getattr(torch().ops, "loaded_libraries", ()) or ()) if p not in libs]
    except Exception:  # noqa: BLE001 - an older torch without the attribute
        pass
    return libs


def vet_program(src: Any, spec: Any, variant: Any, device: DeviceLike, config: SandboxConfig) -> str:
    """Make sure torch can deserialize ``variant`` of ``spec`` in a limited child before the caller
    does. Returns "off", "trusted", "cached" or "vetted"; raises IntegrityError (exit 5) when the
    child crashed, ran out of memory or time, or torch refused the program there."""
    return vet_programs(src, [(spec, variant)], device, config)[spec.name]


def vet_programs(src: Any, items: Sequence[tuple[Any, Any]], device: DeviceLike,
                 config: SandboxConfig, status: Callable[[str], None] | None = None) -> dict[str, str]:
    """``vet_program`` for several programs of one bundle at once: the ones not vetted yet are
    deserialized one after another in a single child (one python + torch start for all).
    Portable programs are deserialized on the CPU there (the child never starts a GPU); an
    AOTInductor package is loaded on ``device``. ``status`` is told one line before the child
    starts (it takes seconds). Returns program name -> "off" | "trusted" | "cached" | "vetted"."""
    device = Device.parse(device)
    if not config.enabled:
        return {spec.name: "off" for spec, _ in items}
    if getattr(src, "trusted_signers", ()):
        return {spec.name: "trusted" for spec, _ in items}
    torch_version = _torch_version()
    digests = {m.path: m.digest for m in src.manifest.members}
    out: dict[str, str] = {}
    todo = []   # (spec, variant, path, record, entry)
    for spec, variant in items:
        path = src.member_file(variant.member)
        record = vetted_path(config, digests.get(variant.member) or _file_digest(path))
        entry = _entry(variant.kind, variant.archive_name, device)
        if _is_vetted(record, entry, torch_version):
            out[spec.name] = "cached"
        else:
            todo.append((spec, variant, path, record, entry))
    if not todo:
        return out
    sizes = sum(os.path.getsize(t[2]) for t in todo)
    memory = config.memory or DEFAULT_MEMORY_BASE + 3 * sizes
    seconds = config.seconds * len(todo)
    limit_kind = "data" if _gpu_build() else "as"
    cmd = [sys.executable, "-m", "registry.runtime.sandbox", "--device", str(device), "--memory", str(memory),
           "--limit", limit_kind, "--seconds", str(int(seconds + 0.999))]
    for mod in config.imports:
        cmd += ["--import", mod]
    for lib in _libraries(config):
        cmd += ["--load-library", lib]
    for _, variant, path, _, _ in todo:
        cmd += ["--program", variant.kind, variant.archive_name, str(path)]
    from .compat import pytree_classes_of

    classes = [c for spec, *_ in todo for c in pytree_classes_of(spec)]
    if classes:  # library output classes: the child stands in for them as the loader does
        cmd += ["--pytree-classes", json.dumps(classes)]
    env = dict(os.environ)
    root = str(PACKAGE_PARENT)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env[ENV_SANDBOX] = "off"  # the child never recurses
    label = src.label or src.digest
    if status is not None:
        names = ", ".join(repr(t[0].name) for t in todo)
        status(f"first load of {label} on this machine: deserializing program{'s' if len(todo) > 1 else ''} "
               f"{names} in a sandbox first (once per program and torch; {ENV_SANDBOX}=off skips it)")
    started = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, stdin=subprocess.DEVNULL,
                              timeout=seconds + 5, errors="replace")
    except subprocess.TimeoutExpired as exc:
        ok = _oks(exc.stdout)
        _remember_all(todo[:ok], torch_version)
        _refuse(f"program {todo[min(ok, len(todo) - 1)][0].name!r} of {label}",
                f"took longer than {seconds:g} s (wall clock)", "",
                f"raise {ENV_SANDBOX_SECONDS} if the program is genuinely that slow to load")
    except OSError as exc:
        _refuse(f"program {todo[0][0].name!r} of {label}", "could not start", f"({exc.strerror or exc})",
                f"{ENV_SANDBOX}=off skips this check (not recommended for unsigned programs)")
    ok = _oks(done.stdout)
    if done.returncode == _RC_INCOMPATIBLE:  # not a verdict on the file: it cannot load *here*
        from ..errors import IncompatibleError

        _remember_all(todo[:ok], torch_version)
        last = next((ln.strip() for ln in reversed((done.stderr or "").splitlines()) if ln.strip()), "")
        raise IncompatibleError(f"program {todo[min(ok, len(todo) - 1)][0].name!r} of {label} cannot load on this "
                                f"machine: {last.split(': ', 1)[-1][:300]}")
    verdict = _verdict(done, memory, seconds, time.monotonic() - started, len(todo))
    if verdict is None or ok < len(todo):  # a failure after the last program: nothing is vetted
        _remember_all(todo[:ok], torch_version)  # those deserialized cleanly before the failure
    if verdict is not None:
        _refuse(f"program {todo[min(ok, len(todo) - 1)][0].name!r} of {label}", *verdict)
    out.update({t[0].name: "vetted" for t in todo})
    return out


def _oks(stdout: Any) -> int:
    """How many programs the child reported as deserialized cleanly."""
    if isinstance(stdout, bytes):
        stdout = stdout.decode("utf-8", "replace")
    return sum(1 for ln in (stdout or "").splitlines() if ln.startswith(_OK_LINE))


def _remember_all(done: Sequence[tuple[Any, Any, Path, Path, str]], torch_version: str) -> None:
    for _, _, _, record, entry in done:
        _remember(record, entry, torch_version)


def _file_digest(path: Path) -> str:
    from ..digests import sha256_stream

    with open(path, "rb") as f:
        return sha256_stream(f)[0]


def _gib(n: int) -> str:
    return f"{n / GiB:.1f} GiB"


def _verdict(done: subprocess.CompletedProcess, memory: int, seconds: float,
             elapsed: float, expected: int = 1) -> tuple[str, str, str] | None:
    """None when the child deserialized every program cleanly, else (what torch did, detail,
    what to do)."""
    rc = done.returncode
    last = next((ln.strip() for ln in reversed((done.stderr or "").splitlines()) if ln.strip()), "")
    if rc == _RC_OK and _oks(done.stdout) == expected:
        return None
    mem_fix = f"raise {ENV_SANDBOX_MEMORY} (now {_gib(memory)}) if the program is genuinely that large"
    if rc == _RC_OOM:
        return "ran out of memory", f"(limit {_gib(memory)}): {last[:200]}", mem_fix
    if rc == _RC_ERROR:
        return "failed", f": {last[:300]}", ("if it needs custom ops, pass --import/--load-library; "
                                             "otherwise the program is damaged or hostile")
    if rc < 0:
        sig = -rc
        try:
            sname = signal.Signals(sig).name
        except ValueError:
            sname = f"signal {sig}"
        if sig == getattr(signal, "SIGXCPU", -1) or (sig == signal.SIGKILL and elapsed >= seconds - 0.5):
            return ("used more than its CPU time", f"({seconds:g} s)",
                    f"raise {ENV_SANDBOX_SECONDS} if the program is genuinely that slow to load")
        if sig == signal.SIGKILL:
            return "was killed", f"({sname}; out of memory?)", mem_fix
        return f"crashed ({sname})", "", CRASHED
    return (f"crashed (exit {rc})", f": {last[:200]}" if last else "", CRASHED)


#: a crash is not always the file's doing: torch 2.11's AOTInductor CUDA loader crashed (SIGSEGV)
#: on a freshly compiled, benign package on an H100, without us (scripts/gpu_aoti_diagnose.py splits
#: such a load into its steps)
CRASHED = ("the program is damaged or hostile, or this torch's own loader crashes on it "
           "(check that the same torch loads a program you built yourself)")


def _refuse(what: str, verb: str, detail: str, fix: str) -> None:
    """``torch crashed (SIGSEGV) deserializing program 'x' of m@3 in the sandbox; ...``"""
    from ..errors import UnsafeArchiveError

    detail = detail if not detail or detail.startswith(":") else " " + detail
    raise UnsafeArchiveError(f"torch {verb} deserializing {what} in the sandbox{detail}; it was not loaded",
                             hint=fix)


# ------------------------------------------------------------------------------------ the child

def _set_limits(memory: int, limit_kind: str, seconds: int) -> None:
    import resource

    which = resource.RLIMIT_DATA if limit_kind == "data" else resource.RLIMIT_AS
    resource.setrlimit(which, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (seconds, seconds + 2))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


_OOM_TEXT = re.compile(r"alloc|out of memory|not enough memory|cannot allocate|bad_alloc", re.I)


def _child(argv: Sequence[str]) -> int:
    import argparse

    from ..errors import IncompatibleError

    p = argparse.ArgumentParser(prog="python -m registry.runtime.sandbox")
    p.add_argument("--program", dest="programs", nargs=3, action="append", required=True,
                   metavar=("KIND", "ARCHIVE_NAME", "PATH"), help="exported_program|aoti, name, file")
    p.add_argument("--device", default="cpu")
    p.add_argument("--memory", type=int, required=True)
    p.add_argument("--limit", choices=["as", "data"], default="as")
    p.add_argument("--seconds", type=int, required=True)
    p.add_argument("--import", dest="imports", action="append", default=[])
    p.add_argument("--load-library", dest="libraries", action="append", default=[])
    p.add_argument("--pytree-classes", default="[]", help="JSON: pytree classes to stand in for")
    a = p.parse_args(argv)
    if any(kind not in ("exported_program", "aoti") for kind, _, _ in a.programs):
        p.error("KIND must be exported_program or aoti")
    _set_limits(a.memory, a.limit, a.seconds)
    try:
        from . import torchrt

        torchrt.load_libraries(a.libraries)
        torchrt.import_modules(a.imports)
        torchrt.stand_in_pytree_classes(json.loads(a.pytree_classes))
        for kind, archive_name, path in a.programs:
            if kind == "aoti":
                loaded: Any = torchrt.load_aoti(path, archive_name, a.device)
            else:
                loaded = torchrt.restore_guards(  # weights mapped, as the loader does
                    torchrt.load_exported_program(path, archive_name, map_weights=True)).module()
            del loaded  # one at a time
            print(_OK_LINE, flush=True)
    except MemoryError as exc:
        print(f"MemoryError: {exc}", file=sys.stderr)
        return _RC_OOM
    except IncompatibleError as exc:  # a device or library this machine lacks: exit 4, not a verdict
        print(f"IncompatibleError: {exc.one_line()}", file=sys.stderr)
        return _RC_INCOMPATIBLE
    except BaseException as exc:  # noqa: BLE001 - every failure is a verdict
        text = " ".join(str(exc).split()) or type(exc).__name__
        cause = exc.__cause__
        if isinstance(cause, MemoryError) or _OOM_TEXT.search(text) or (
                cause is not None and _OOM_TEXT.search(str(cause))):
            print(f"{type(exc).__name__}: {text[:300]}", file=sys.stderr)
            return _RC_OOM
        print(f"{type(exc).__name__}: {text[:300]}", file=sys.stderr)
        return _RC_ERROR
    return _RC_OK


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
