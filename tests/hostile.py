"""Hostile artifacts for security tests: pickles that would run a shell command if unpickled.

The payload only touches a marker file, so a test can prove it never ran.
"""
from __future__ import annotations

import io
import json
import os
from pathlib import Path

from registry.digests import sha256_bytes
from registry.format.bundle import BundleFile, write_bundle
from registry.format.manifest import Manifest
from registry.format.zipsafe import open_entry, read_entries
from registry.format.zipwrite import DeterministicZipWriter
from registry.pt2.safety import walk_dicts


def evil_pickle(marker: Path) -> bytes:
    """torch.save bytes whose unpickling runs ``touch marker`` (refused by weights_only=True)."""
    import torch

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    buf = io.BytesIO()
    torch.save((Evil(),), buf)
    return buf.getvalue()


def rewrite_pt2(src: Path, dest: Path, replace: dict[str, bytes] | None = None, *,
                add: dict[str, bytes] | None = None, drop: tuple[str, ...] = ()) -> Path:
    """Copy a .pt2 replacing members in place, leaving out ``drop`` and appending ``add``
    (all names relative to the root folder)."""
    entries = read_entries(src)
    root = next(iter(entries)).split("/", 1)[0]
    replace = replace or {}
    with open(dest, "wb") as out:
        w = DeterministicZipWriter(out)
        for name, entry in entries.items():
            rel = name.split("/", 1)[1]
            if rel in drop:
                continue
            if rel in replace:
                w.write_bytes(name, replace[rel])
            else:
                with open_entry(src, entry) as f:
                    w.write_stream(name, f, entry.size)
        for rel, data in (add or {}).items():
            w.write_bytes(f"{root}/{rel}", data)
        w.close()
    return dest


def read_json_member(src: Path, rel: str) -> dict | None:
    """A JSON member of a .pt2 (name relative to the root folder), or None when absent."""
    entries = read_entries(src)
    root = next(iter(entries)).split("/", 1)[0]
    entry = entries.get(f"{root}/{rel}")
    if entry is None:
        return None
    with open_entry(src, entry) as f:
        return json.loads(f.read())


def pt2_with_evil_sample_inputs(src: Path, dest: Path, marker: Path) -> Path:
    return rewrite_pt2(src, dest, {"data/sample_inputs/model.pt": evil_pickle(marker)})


def pt2_with_pickled_weight(src: Path, dest: Path, marker: Path) -> Path:
    """Mark the first weight as pickled (``use_pickle``) and make it a malicious pickle."""
    cfg = read_json_member(src, "data/weights/model_weights_config.json")
    first = next(iter(cfg["config"].values()))
    first["use_pickle"] = True
    return rewrite_pt2(src, dest, {"data/weights/model_weights_config.json": json.dumps(cfg).encode(),
                                   f"data/weights/{first['path_name']}": evil_pickle(marker)})


def canonical_pt2_bytes(data: bytes) -> bytes:
    """``data`` (a .pt2) rewritten in the bundler's canonical layout with its content kept,
    hostile members included: root ``archive/``, no per-save id, JSON members that parse
    re-serialized canonically. An attacker can do this too, so the loader's content checks
    must hold on such members, not only its layout checks."""
    from registry.digests import canonical_json

    src = io.BytesIO(data)
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "in.pt2"
        path.write_bytes(data)
        entries = read_entries(path)
        out = io.BytesIO()
        w = DeterministicZipWriter(out)
        for name, entry in entries.items():
            rel = name.split("/", 1)[1]
            if rel == ".data/serialization_id":
                continue
            with open_entry(path, entry) as f:
                raw = f.read()
            if rel.endswith(".json"):
                try:
                    raw = canonical_json(json.loads(raw))
                except ValueError:
                    pass
            w.write_bytes(f"archive/{rel}", raw)
        w.close()
    del src
    return out.getvalue()


def bundle_with_raw_member(good: Path, dest: Path, member: str, data: bytes, *, canonical: bool = True) -> Path:
    """A well-formed bundle (all digests consistent) whose program member is ``data``; with
    ``canonical`` (the default) laid out as the bundler would (``canonical_pt2_bytes``), else as
    is: both are what an attacker could hand over."""
    if canonical:
        data = canonical_pt2_bytes(data)
    src = BundleFile.open(good)
    raw = src.manifest.to_json()
    for m in raw["members"]:
        if m["path"] == member:
            m.update(sha256=sha256_bytes(data), size=len(data))
            m.pop("chunks", None)
    manifest = Manifest.from_raw(raw)
    sources = {m.path: (lambda p=m.path: src.open_member(p)) for m in manifest.members}
    sources[member] = lambda: io.BytesIO(data)
    write_bundle(dest, manifest, sources)
    return dest


def evil_raw_pickle(marker: Path, align: int = 8) -> bytes:
    """Plain ``pickle`` bytes (what torch ``pickle.loads`` for opaque constants) that touch
    ``marker``, padded after the STOP opcode to a multiple of ``align`` bytes."""
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    data = pickle.dumps(Evil())
    return data + b"\0" * (-len(data) % align)


def _model_json(src: Path, prog: str = "model") -> dict:
    return read_json_member(src, f"models/{prog}.json")


def pt2_with_sympy_payload(src: Path, dest: Path, marker: Path) -> Path:
    """Replace the last symbolic-size expression (``expr_str``, which torch hands to
    ``sympy.sympify``, i.e. eval) with one that touches ``marker``, keeping the symbol name in
    it so a grep for the symbol still matches."""
    model = _model_json(src)
    exprs = [d for d in walk_dicts(model) if isinstance(d.get("expr_str"), str)]
    assert exprs, f"{src} has no symbolic sizes"
    exprs[-1]["expr_str"] = (f"Symbol('s0') if __import__('os').system('touch {marker}') == 0 "
                             f"else Symbol('s0')")
    return rewrite_pt2(src, dest, {"models/model.json": json.dumps(model).encode()})


def pt2_with_node_target(src: Path, dest: Path, target: str) -> Path:
    """Point the first operator node of the graph at ``target`` (torch resolves it by getattr
    from ``torch``/``_operator``/``math`` and calls it when the program runs)."""
    model = _model_json(src)
    node = next(d for d in walk_dicts(model) if "target" in d and "inputs" in d)
    node["target"] = target
    return rewrite_pt2(src, dest, {"models/model.json": json.dumps(model).encode()})


def pt2_with_pickled_constant(src: Path, dest: Path, marker: Path, prefix: str = "opaque_obj_") -> Path:
    """Add a constant whose path is ``opaque_obj_*`` (torch ``pickle.loads`` it whatever
    ``use_pickle`` says) to the constants config."""
    cfg = read_json_member(src, "data/constants/model_constants_config.json") or {"config": {}}
    weights = read_json_member(src, "data/weights/model_weights_config.json")
    meta = next(iter(weights["config"].values()))["tensor_meta"]
    # use_pickle False with a plausible tensor_meta: torch still unpickles it (by its prefix)
    cfg["config"]["evil"] = {"path_name": f"{prefix}0", "is_param": False, "use_pickle": False,
                             "tensor_meta": meta}
    return rewrite_pt2(src, dest, add={"data/constants/model_constants_config.json": json.dumps(cfg).encode(),
                                       f"data/constants/{prefix}0": evil_raw_pickle(marker)},
                       drop=("data/constants/model_constants_config.json",))


def pt2_with_dangling_output(src: Path, dest: Path) -> Path:
    """A graph our reader accepts but torch cannot load: its output names no value."""
    model = _model_json(src)
    model["graph_module"]["graph"]["outputs"][0] = {"as_tensor": {"name": "no_such_value"}}
    return rewrite_pt2(src, dest, {"models/model.json": json.dumps(model).encode(),
                                   "data/sample_inputs/model.pt": b""})


# -- edits of a parsed graph JSON (``models/<prog>.json``) for the program-validation attacks --

def graph_of(model: dict) -> dict:
    return model["graph_module"]["graph"]


def node_of(model: dict, i: int = 0) -> dict:
    return graph_of(model)["nodes"][i]


def sym_srepr(i: int) -> str:
    """The srepr torch writes for size symbol ``s<i>``."""
    return f"Symbol('s{i}', positive=True, integer=True)"


def set_kwargs_key(model: dict, key: str) -> None:
    """Give the program's keyword input the name ``key`` in its input treespec (torch pastes
    these names into the Python it generates)."""
    sig = model["graph_module"]["module_call_graph"][0]["signature"]
    spec = json.loads(sig["in_spec"])
    spec[1]["children_spec"][1]["context"] = json.dumps([key])
    spec[1]["children_spec"][1]["children_spec"] = [{"type": None, "context": None, "children_spec": []}]
    sig["in_spec"] = json.dumps(spec)
