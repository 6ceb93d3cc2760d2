"""Command-line start-up: ``pt2reg --help``, ``list``, ``show``, ``push``, ``pull`` (tiny bundle).

Wall time of the whole process (medians) against ``python -c "import sqlalchemy"`` (issue 45:
list, show, push and pull each within 2x of it; the pull is cold, its cache emptied first),
``--help`` against the bare interpreter (``python -c pass``), and the CPU time of each process
(user + system, its children included: what a busy machine distorts least) against that of
``import sqlalchemy``. ``python -X importtime -m registry.cli ...`` tells what each command imports:
whether torch is among it, the total import time and the heaviest top-level imports. The
registry's bytecode is compiled first, as ``pip install`` leaves it.
"""
from __future__ import annotations

import compileall
import re
import resource
import shutil

from _common import PT2REG, PYTHON, REPO, Row, median, models, parse_args, report, run, scratch, side_by_side

_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \|(\s*)(\S+)")


def importtime(args: list[str]) -> dict:
    """Modules imported by ``python -m registry.cli ARGS``: torch?, total ms, heaviest top-level."""
    err = run([PYTHON, "-X", "importtime", "-m", "registry.cli", *args]).stderr
    mods, top = [], []
    for line in err.splitlines():
        m = _LINE.match(line)
        if m:
            self_us, cum_us, indent, name = int(m[1]), int(m[2]), len(m[3]), m[4]
            mods.append((name, self_us))
            if indent == 1:
                top.append((name, cum_us / 1000))
    names = {n for n, _ in mods}
    return {"torch": "torch" in names, "sqlalchemy": "sqlalchemy" in names, "boto3": "boto3" in names,
            "modules": len(names), "total_ms": sum(s for _, s in mods) / 1000,
            "heaviest": sorted(top, key=lambda x: -x[1])[:6]}


def cpu_seconds(cmd: list[str]) -> float:
    """User + system CPU time of ``cmd`` and its children."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run(cmd)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime


def main() -> None:
    args = parse_args(__doc__, default_reps=7)
    compileall.compile_dir(str(REPO / "registry"), quiet=1)
    ms = models(args.quick)
    with scratch("cli-") as work:
        home = ["--home", str(work / "home")]
        run([PT2REG, *home, "push", str(ms.bundle("tiny")), "--name", "bench", "--alias", "prod"])
        commands = {
            "python -c pass": [PYTHON, "-c", "pass"],
            "python -c 'import sqlalchemy'": [PYTHON, "-c", "import sqlalchemy"],
            "pt2reg --help": [PT2REG, "--help"],
            "pt2reg list": [PT2REG, *home, "list"],
            "pt2reg show bench@prod": [PT2REG, *home, "show", "bench@prod"],
            "pt2reg push (tiny, exists)": [PT2REG, *home, "push", str(ms.bundle("tiny")), "--name", "bench"],
            "pt2reg pull bench@1": [PT2REG, *home, "pull", "bench@1", "-o", str(work / "out.pt2b")],
        }
        cases = {k: (lambda c=c: run(c)) for k, c in commands.items()}
        cache = work / "home" / "cache"

        def cold_pull(c: list[str] = commands["pt2reg pull bench@1"]) -> None:
            shutil.rmtree(cache, ignore_errors=True)   # a cold pull: nothing cached (~1 ms of a few files)
            run(c)

        cases["pt2reg pull bench@1"] = cold_pull
        side_by_side(1, cases)  # warm-up: .pyc files, page cache
        t = side_by_side(args.reps, cases)
        cpu: dict[str, list[float]] = {k: [] for k in commands}
        names = list(commands)
        for rep in range(args.reps):  # interleaved, the order rotated, as side_by_side does
            for k in names[rep % len(names):] + names[:rep % len(names)]:
                cpu[k].append(cpu_seconds(commands[k]))
        imports = {k: importtime(c[1:]) for k, c in commands.items() if c[0] == PT2REG}
    base = median(t["python -c pass"])
    sqla_cpu = median(cpu["python -c 'import sqlalchemy'"])
    sqla_wall = median(t["python -c 'import sqlalchemy'"])
    rows = []
    for k, times in t.items():
        if k == "python -c pass":
            rows.append(Row("python -c pass (interpreter start-up)", base))
            continue
        if k.startswith("python -c 'import"):
            rows.append(Row(k, sqla_wall, note="the yardstick of the wall rows (issue 45: each within 2x)"))
            rows.append(Row(f"{k}, CPU time", sqla_cpu, note="the yardstick of the CPU rows"))
            continue
        if k != "pt2reg --help":
            ratio = median(cpu[k]) / sqla_cpu
            rows.append(Row(f"{k}, CPU time", median(cpu[k]), sqla_cpu, target="<= 2x import sqlalchemy",
                            ok=ratio <= 2.0, note=f"modules imported: {imports[k]['modules']}"))
        imp = imports[k]
        if k == "pt2reg --help":
            raw, target, ok = base, "< 0.5 s", median(times) < 0.5
        else:   # wall time against `import sqlalchemy` (issue 45), and no torch
            raw, target = sqla_wall, "<= 2x import sqlalchemy, no torch"
            ok = median(times) <= 2 * sqla_wall and not imp["torch"]
        rows.append(Row(k, median(times), raw, target=target, ok=ok,
                        note=f"torch imported: {'YES' if imp['torch'] else 'no'}; imports {imp['total_ms']:.0f} ms, "
                             f"heaviest: " + ", ".join(f"{n} {ms_:.0f} ms" for n, ms_ in imp["heaviest"][:3])))
    report("cli", "Command-line start-up (raw = import sqlalchemy, wall and CPU; --help: bare interpreter)", rows, args,
           {"timings": t, "cpu_seconds": cpu, "importtime": imports,
            "commands": {k: " ".join(c) for k, c in commands.items()}})


if __name__ == "__main__":
    main()
