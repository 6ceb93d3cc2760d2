"""Two versions side by side, as data: what changed in their signatures, their custom-op sets
and their bytes. Pure: two typed manifests in, frozen values out (the compare page renders them).
For example (``old`` and ``new`` typed manifests)::

    c = compare_manifests(old, new)
    [(t.name, t.change, t.before, t.after) for t in c.tensors]
    # -> [('tokens', 'shape', '[batch 1..8, seq 2..16]', '[batch 1..8, seq 2..32]')]
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from ...format.manifest import Manifest, Member, ProgramSpec, Size, TensorSpec

__all__ = ["TensorChange", "ProgramChange", "OpChange", "MemberChange", "ChunkTotals", "Comparison",
           "compare_manifests", "dim_text", "shape_text"]


def dim_text(d: Size) -> str:
    """A static size as its number; a dynamic one as ``NAME MIN..MAX`` (``seq 2..16``)."""
    if isinstance(d, int):
        return str(d)
    return f"{d.label} {d.min}..{'inf' if d.max is None else d.max}"


def shape_text(shape: Sequence[Size] | None) -> str:
    return "?" if shape is None else "[" + ", ".join(dim_text(d) for d in shape) + "]"


@dataclass(frozen=True)
class ProgramChange:
    name: str
    change: str                     # added | removed


@dataclass(frozen=True)
class TensorChange:
    """One input or output of a program in both, or only one, of the versions."""

    program: str
    side: str                       # input | output
    name: str
    change: str                     # added | removed | dtype | shape | dtype+shape
    before: str | None              # "float32 [batch 1..8, seq 2..16]"
    after: str | None
    dims: tuple[str, ...] = ()      # which dims differ: "1: seq 2..16 -> seq 2..32"


@dataclass(frozen=True)
class OpChange:
    program: str
    op: str                         # ns::op.overload
    change: str                     # added | removed


@dataclass(frozen=True)
class MemberChange:
    path: str
    role: str
    size_a: int | None
    size_b: int | None
    change: str                     # same | changed | added | removed


@dataclass(frozen=True)
class ChunkTotals:
    """Bytes of the second version already held by the first (``shared``), only in the
    second (``new``: what a pull of it after the first downloads), only in the first."""

    size_a: int
    size_b: int
    shared_bytes: int
    new_bytes: int
    removed_bytes: int
    shared_chunks: int
    new_chunks: int
    removed_chunks: int


@dataclass(frozen=True)
class Comparison:
    programs: tuple[ProgramChange, ...]
    tensors: tuple[TensorChange, ...]
    ops: tuple[OpChange, ...]
    members: tuple[MemberChange, ...]
    chunks: ChunkTotals
    same_digest: bool

    @property
    def signature_changed(self) -> bool:
        return bool(self.programs or self.tensors)


def _spec_text(t: TensorSpec) -> str:
    return f"{t.dtype} {shape_text(t.shape)}"


def _dim_changes(a: TensorSpec, b: TensorSpec) -> tuple[str, ...]:
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return (f"rank {len(a.shape or ())} -> {len(b.shape or ())}",) if (a.shape or b.shape) else ()
    return tuple(f"{i}: {dim_text(x)} -> {dim_text(y)}"
                 for i, (x, y) in enumerate(zip(a.shape, b.shape)) if dim_text(x) != dim_text(y))


def _tensor_changes(program: str, side: str, before: Iterable[TensorSpec],
                    after: Iterable[TensorSpec]) -> list[TensorChange]:
    old = {t.name: t for t in before}
    new = {t.name: t for t in after}
    out = []
    for name, t in old.items():
        if name not in new:
            out.append(TensorChange(program, side, name, "removed", _spec_text(t), None))
    for name, t in new.items():
        o = old.get(name)
        if o is None:
            out.append(TensorChange(program, side, name, "added", None, _spec_text(t)))
            continue
        kinds = [k for k, differs in (("dtype", o.dtype != t.dtype),
                                      ("shape", shape_text(o.shape) != shape_text(t.shape))) if differs]
        if kinds:
            out.append(TensorChange(program, side, name, "+".join(kinds), _spec_text(o), _spec_text(t),
                                    _dim_changes(o, t)))
    return out


def _ops(prog: ProgramSpec | None) -> set[str]:
    if prog is None:
        return set()
    return {f"{op.name}.{op.overload}" for op in prog.required_ops} | {
        f"torchbind {c}" for c in prog.torchbind_classes}


def _chunks(members: Iterable[Member]) -> dict[str, int]:
    """Content-addressed pieces of a bundle: each member's chunks (the member itself when it
    was stored whole), by digest."""
    out: dict[str, int] = {}
    for m in members:
        for digest, size in (m.chunks or ((m.digest, m.size),)):
            out[digest] = size
    return out


def compare_manifests(a: Manifest, b: Manifest) -> Comparison:
    """What changed from ``a`` to ``b``."""
    programs = [ProgramChange(n, "removed") for n in a.programs if n not in b.programs]
    programs += [ProgramChange(n, "added") for n in b.programs if n not in a.programs]
    tensors: list[TensorChange] = []
    ops: list[OpChange] = []
    for name in [*a.programs, *(n for n in b.programs if n not in a.programs)]:
        pa, pb = a.programs.get(name), b.programs.get(name)
        tensors += _tensor_changes(name, "input", pa.inputs if pa else (), pb.inputs if pb else ())
        tensors += _tensor_changes(name, "output", pa.outputs if pa else (), pb.outputs if pb else ())
        oa, ob = _ops(pa), _ops(pb)
        ops += [OpChange(name, op, "removed") for op in sorted(oa - ob)]
        ops += [OpChange(name, op, "added") for op in sorted(ob - oa)]
    members = []
    for m in a.members:
        other = b.member(m.path)
        change = "removed" if other is None else ("same" if other.digest == m.digest else "changed")
        members.append(MemberChange(m.path, m.role, m.size, other.size if other else None, change))
    members += [MemberChange(m.path, m.role, None, m.size, "added") for m in b.members if a.member(m.path) is None]
    ca, cb = _chunks(a.members), _chunks(b.members)
    shared = set(ca) & set(cb)
    totals = ChunkTotals(
        a.total_size, b.total_size,
        shared_bytes=sum(cb[d] for d in shared), new_bytes=sum(s for d, s in cb.items() if d not in ca),
        removed_bytes=sum(s for d, s in ca.items() if d not in cb), shared_chunks=len(shared),
        new_chunks=len(set(cb) - shared), removed_chunks=len(set(ca) - shared))
    return Comparison(tuple(programs), tuple(tensors), tuple(ops), tuple(members), totals,
                      a.digest == b.digest)
