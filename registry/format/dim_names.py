"""Dim names for bundled programs: given by the user (``--dim``), and carried across programs.

A ``.pt2`` file does not record the user's ``Dim`` names, and torch numbers its shape symbols
per program: the batch that is ``s31`` in the encoder is ``s59`` in the decoder. Names reach a
bundle in two ways:

1. **Given.** ``pt2reg bundle --dim PROGRAM:SYMBOL=NAME`` (``dim_names={"encoder": {"s31":
   "batch"}}`` in Python) names one symbol of one program. SYMBOL is a graph symbol (``s31``)
   or an input's dimension, ``INPUT.D`` / ``INPUT[D]`` (``tokens.0``), whose size must be a
   plain symbol. ``PROGRAM:`` may be left out when the bundle has one program. Live
   ``ExportedProgram``s bundled with their ``dynamic_shapes`` are named from those.
2. **Carried over** (automatic, the one rule): a named symbol of program P that is the size of
   P's input *i*, dimension *d*, names the symbol at input *i*, dimension *d* of every other
   program Q when that size there is a plain symbol with **the same range**, Q has no name for
   it, every named symbol that reaches it agrees on the name, and Q does not already use the
   name for another symbol. Only given names travel (one hop, no chains), and each one carried
   is reported as a note, so a wrong guess is seen and can be overridden with another
   ``--dim Q:SYMBOL=NAME``.

Naming a symbol also names every size expression over named symbols (``s27 + 1`` becomes
``seq + 1``). Names are display metadata: they change the manifest (and so the digest), never
which inputs a program accepts.
"""
from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from dataclasses import replace

from ..constants import UNNAMED_PROGRAM_HINT
from ..errors import UsageError
from .manifest import Dim, ProgramSpec, TensorSpec

__all__ = ["parse_dim_option", "name_dims"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
_INPUT_DIM = re.compile(r"^(?P<input>[A-Za-z_][A-Za-z0-9_]*)(?:\.(?P<a>\d+)|\[(?P<b>\d+)\])$")
_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_dim_option(text: str) -> tuple[str | None, str, str]:
    """``PROGRAM:SYMBOL=NAME`` (or ``SYMBOL=NAME``) -> (program or None, symbol, name)."""
    left, sep, name = text.partition("=")
    program, colon, symbol = left.rpartition(":")
    if not sep or not symbol or not name or (colon and not program):
        raise UsageError(f"expected PROGRAM:SYMBOL=NAME, got {text!r}",
                         hint="e.g. --dim encoder:s31=batch or --dim encoder:tokens.0=batch; " + UNNAMED_PROGRAM_HINT)
    if not _NAME.match(name):
        raise UsageError(f"invalid Dim name {name!r} in --dim {text!r}",
                         hint="a Dim name is a Python identifier (letters, digits, '_')")
    return (program or None), symbol, name


def _symbols(desc: ProgramSpec) -> dict[str, tuple[int, int | None]]:
    """The program's plain symbols (``s31``) with their ranges."""
    return {c.expr: (c.min, c.max) for c in desc.range_constraints if _TOKEN.fullmatch(c.expr)}


def _known(desc: ProgramSpec) -> dict[str, str]:
    """Names the program already has (live ExportedPrograms bundled with their dynamic_shapes)."""
    return {c.expr: c.dim for c in desc.range_constraints if c.dim and _TOKEN.fullmatch(c.expr)}


def _input_symbol(desc: ProgramSpec, i: int, d: int) -> str | None:
    if i >= len(desc.inputs):
        return None
    shape = desc.inputs[i].shape or ()
    if d >= len(shape) or not isinstance(shape[d], Dim):
        return None
    expr = shape[d].expr
    return expr if expr in _symbols(desc) else None


def _resolve(program: str, desc: ProgramSpec, key: str) -> str:
    symbols = _symbols(desc)
    if key in symbols:
        return key
    m = _INPUT_DIM.match(key)
    if m:
        name, d = m.group("input"), int(m.group("a") or m.group("b"))
        idx = next((i for i, inp in enumerate(desc.inputs) if inp.name == name), None)
        if idx is None:
            names = ", ".join(i.name for i in desc.inputs)
            raise UsageError(f"--dim {program}:{key}: program {program!r} has no input {name!r} (inputs: {names})")
        sym = _input_symbol(desc, idx, d)
        if sym is None:
            shape = desc.inputs[idx].shape or ()
            size = shape[d] if d < len(shape) else None
            what = ("has no dimension " + str(d)) if size is None else (
                f"dimension {d} is {size.expr!r}, not a plain symbol" if isinstance(size, Dim)
                else f"dimension {d} is static ({size})")
            raise UsageError(f"--dim {program}:{key}: input {name!r} {what}",
                             hint="name the symbols it is made of instead")
        return sym
    listed = ", ".join(sorted(symbols, key=lambda s: (len(s), s))) or "none"
    raise UsageError(f"--dim {program}:{key}: program {program!r} has no symbol {key!r} (symbols: {listed})",
                     hint="give a symbol as `pt2reg inspect` shows it (s31) or INPUT.D (tokens.0)")


def _render(expr: str, names: Mapping[str, str]) -> str | None:
    """``expr`` over Dim names when every symbol in it is named (functions are followed by '(')."""
    out, pos, syms = [], 0, 0
    for m in _TOKEN.finditer(expr):
        if expr[m.end():].lstrip().startswith("(") or (m.start() and expr[m.start() - 1].isdigit()):
            continue
        if m.group() not in names:
            return None
        out.append(expr[pos:m.start()])
        out.append(names[m.group()])
        pos, syms = m.end(), syms + 1
    return "".join(out) + expr[pos:] if syms else None


def _named(dim: Dim, names: Mapping[str, str]) -> Dim:
    text = _render(dim.expr, names)
    return dim if text is None else replace(dim, dim=text)


def _apply(desc: ProgramSpec, names: Mapping[str, str]) -> ProgramSpec:
    def values(specs: tuple[TensorSpec, ...]) -> tuple[TensorSpec, ...]:
        return tuple(s if s.shape is None else replace(s, shape=tuple(
            _named(d, names) if isinstance(d, Dim) else d for d in s.shape)) for s in specs)

    return replace(desc, inputs=values(desc.inputs), outputs=values(desc.outputs),
                   range_constraints=tuple(_named(c, names) for c in desc.range_constraints))


def name_dims(programs: MutableMapping[str, ProgramSpec],
              given: Mapping[str | None, Mapping[str, str]] | None = None) -> list[str]:
    """Apply given Dim names and carry them across programs (rule in the module docstring).

    ``programs``: the bundle's programs in the order given; each named one is replaced by its
    named copy.
    ``given``: program (None: the only one) -> {symbol or INPUT.D: name}. Returns notes, one per
    name carried to another program. Raises UsageError for an unknown program, symbol or input,
    a size that is not a plain symbol, or two symbols of one program given one name.
    """
    explicit: dict[str, dict[str, str]] = {}
    for program, keys in (given or {}).items():
        if program is None:
            if len(programs) != 1:
                raise UsageError(f"--dim without PROGRAM: the bundle has programs {', '.join(programs)}",
                                 hint="write --dim PROGRAM:SYMBOL=NAME")
            program = next(iter(programs))
        if program not in programs:
            raise UsageError(f"--dim for unknown program {program!r}; programs: {', '.join(programs)}",
                             hint=UNNAMED_PROGRAM_HINT)
        target = explicit.setdefault(program, {})
        for key, name in keys.items():
            if not _NAME.match(str(name)):
                raise UsageError(f"invalid Dim name {name!r} for {program}:{key}",
                                 hint="a Dim name is a Python identifier (letters, digits, '_')")
            sym = _resolve(program, programs[program], key)
            if target.get(sym, name) != name:
                raise UsageError(f"--dim gives {program}:{sym} two names: {target[sym]!r} and {name!r}")
            target[sym] = name
    names: dict[str, dict[str, str]] = {}
    for program, desc in programs.items():
        merged = {**_known(desc), **explicit.get(program, {})}
        taken: dict[str, str] = {}
        for sym, name in merged.items():
            if name in taken and taken[name] != sym:
                raise UsageError(f"program {program!r}: Dim name {name!r} given to both {taken[name]} and {sym}",
                                 hint="one name means one size within a program")
            taken[name] = sym
        names[program] = merged
    # carry over: (program, symbol) -> {name: (source program, source symbol, i, d)}
    offers: dict[tuple[str, str], dict[str, tuple[str, str, int, int]]] = {}
    for src, desc in programs.items():
        ranges = _symbols(desc)
        for i, inp in enumerate(desc.inputs):
            for d, _ in enumerate(inp.shape or ()):
                sym = _input_symbol(desc, i, d)
                if sym is None or sym not in names[src]:
                    continue
                for dst, other in programs.items():
                    if dst == src:
                        continue
                    there = _input_symbol(other, i, d)
                    if there is None or there in names[dst] or _symbols(other)[there] != ranges[sym]:
                        continue
                    offers.setdefault((dst, there), {}).setdefault(names[src][sym], (src, sym, i, d))
    reach: dict[tuple[str, str], set[str]] = {}  # (program, name) -> symbols it would name
    for (dst, sym), by_name in offers.items():
        for name in by_name:
            reach.setdefault((dst, name), set()).add(sym)
    notes = []
    for (dst, sym), by_name in offers.items():
        if len(by_name) != 1:
            continue  # two names reach it: leave it unnamed rather than guess
        name, (src, src_sym, i, d) = next(iter(by_name.items()))
        if name in names[dst].values() or len(reach[(dst, name)]) != 1:
            continue  # the name is taken there, or would name two symbols
        names[dst][sym] = name
        inp = programs[dst].inputs[i].name
        lo, hi = _symbols(programs[dst])[sym]
        notes.append(f"program {dst!r}: {sym} (input {inp!r} dim {d}, {lo}..{'' if hi is None else hi}) "
                     f"named {name!r} like {src}:{src_sym} at the same position; "
                     f"override with --dim {dst}:{sym}=NAME")
    for program, desc in list(programs.items()):
        if names[program]:
            programs[program] = _apply(desc, names[program])
    return notes
