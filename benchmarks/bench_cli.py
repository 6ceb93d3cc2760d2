"""Command-line start-up: ``pt2reg --help``, ``list``, ``show``, ``push``, ``pull`` (tiny bundle).

Wall time of the whole process (medians), beside the bare interpreter (``python -c pass``).
``python -X importtime -m registry.cli ...`` tells what each command imports: whether torch is
among it, the total import time and the heaviest top-level imports.
"""
from __future__ import annotations

import re

from _common import PT2REG, PYTHON, Row, median, models, parse_args, report, run, scratch, side_by_side

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


def main() -> None:
    args = parse_args(__doc__, default_reps=7)
    ms = models(args.quick)
    with scratch("cli-") as work:
        home = ["--home", str(work / "home")]
        run([PT2REG, *home, "push", str(ms.bundle("tiny")), "--name", "bench", "--alias", "prod"])
        commands = {
            "python -c pass": [PYTHON, "-c", "pass"],
            "pt2reg --help": [PT2REG, "--help"],
            "pt2reg list": [PT2REG, *home, "list"],
            "pt2reg show bench@prod": [PT2REG, *home, "show", "bench@prod"],
            "pt2reg push (tiny, exists)": [PT2REG, *home, "push", str(ms.bundle("tiny")), "--name", "bench"],
            "pt2reg pull bench@1": [PT2REG, *home, "pull", "bench@1", "-o", str(work / "out.pt2b")],
        }
        cases = {k: (lambda c=c: run(c)) for k, c in commands.items()}
        side_by_side(1, cases)  # warm-up: .pyc files, page cache
        t = side_by_side(args.reps, cases)
        imports = {k: importtime(c[1:]) for k, c in commands.items() if c[0] == PT2REG}
    base = median(t["python -c pass"])
    rows = []
    for k, times in t.items():
        if k == "python -c pass":
            rows.append(Row("python -c pass (interpreter start-up)", base))
            continue
        imp = imports[k]
        target, ok = ("< 0.5 s", median(times) < 0.5) if k == "pt2reg --help" else ("no torch", not imp["torch"])
        rows.append(Row(k, median(times), base, target=target, ok=ok,
                        note=f"torch imported: {'YES' if imp['torch'] else 'no'}; imports {imp['total_ms']:.0f} ms, "
                             f"heaviest: " + ", ".join(f"{n} {ms_:.0f} ms" for n, ms_ in imp["heaviest"][:3])))
    report("cli", "Command-line start-up (raw = bare interpreter)", rows, args,
           {"timings": t, "importtime": imports})


if __name__ == "__main__":
    main()
