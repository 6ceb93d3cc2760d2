"""Hugging Face models (issue 15, items 1 and 6): library output classes end to end.

Tiny random-weight GPT-2 (causal LM), BERT (encoder only) and T5 (encoder + decoder as two
programs) are exported once per session in a subprocess (the only process that imports
transformers) by the same code as ``examples/hf_*.py``, bundled with samples and Dim names,
pushed, pulled by digest and run in a fresh process where transformers is never imported.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_inprocess import invoker
from tests.shared import built_once

pytest.importorskip("transformers")  # a test-only dependency (pyproject [dev], pinned)

ROOT = Path(__file__).resolve().parents[2]

_BUILD = r"""
import sys
from pathlib import Path
import torch
from torch.export import Dim
from transformers import BertConfig, BertModel
from examples import hf_causal_lm, hf_encoder_decoder
from examples.hf_models import export_and_bundle

work = Path(sys.argv[1])
hf_causal_lm.build(work)
hf_encoder_decoder.build(work)
torch.manual_seed(0)
bert = BertModel(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64))
batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=2, max=64)
kwargs = {"input_ids": torch.randint(0, 100, (2, 6)), "attention_mask": torch.ones(2, 6, dtype=torch.long)}
export_and_bundle(work / "bert.pt2b", {"encoder": (bert, kwargs, {"input_ids": {0: batch, 1: seq},
                                                                   "attention_mask": {0: batch, 1: seq}})})
"""

#: bundle -> (registry name, --chain for hf_run.py, {program: (serialized class, fields)})
MODELS = {
    "gpt2": ("hf/gpt2", None, {"lm": ("transformers.modeling_outputs.CausalLMOutputWithCrossAttentions",
                                      ["logits"])}),
    "bert": ("hf/bert", None, {"encoder": ("transformers.modeling_outputs.BaseModelOutputWithPoolingAndCrossAttentions",
                                           ["last_hidden_state", "pooler_output"])}),
    "t5": ("hf/t5", "encoder.last_hidden_state>decoder.encoder_hidden_states",
           {"encoder": ("transformers.modeling_outputs.BaseModelOutputWithPastAndCrossAttentions",
                        ["last_hidden_state"]),
            "decoder": ("transformers.modeling_outputs.Seq2SeqLMOutput",
                        ["logits", "encoder_last_hidden_state"])}),
}


@pytest.fixture(scope="session")
def hf_bundles(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    def build(work: Path) -> None:   # once per run, shared by the xdist workers
        env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        done = subprocess.run([sys.executable, "-c", _BUILD, str(work)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:]

    work = built_once(tmp_path_factory, "hf", build)
    return {name: work / f"{name}.pt2b" for name in MODELS}


@pytest.fixture(scope="session")
def hf_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hf-home") / "home"


@pytest.mark.parametrize("model", list(MODELS))
def test_inspect_uses_field_paths_and_names(model: str, hf_bundles: dict[str, Path], hf_home: Path) -> None:
    pt2reg = invoker(hf_home)
    r = pt2reg("inspect", hf_bundles[model], "--json")
    assert r.exit_code == 0, r.output
    view = json.loads(r.stdout)
    expected = MODELS[model][2]
    assert set(view["programs"]) == set(expected)
    for prog, (cls, fields) in expected.items():
        p = view["programs"][prog]
        assert [o["path"] for o in p["outputs"]] == [f"out[{f!r}]" for f in fields]
        assert [o["name"] for o in p["outputs"]] == fields
        assert p["pytree_classes"] == [{"type": cls, "fields": fields}]
        dims = {d.get("dim") for i in p["inputs"] for d in i["shape"] if isinstance(d, dict)}
        assert "batch" in dims and dims - {"batch"}, dims  # Dim names kept
    human = pt2reg("inspect", hf_bundles[model])
    assert human.exit_code == 0
    text = " ".join(human.stdout.split())
    for prog, (cls, fields) in expected.items():  # noqa: B007
        assert f"out['{fields[0]}']" in text and cls in text


def _cli(home: Path, *args: str) -> str:
    result = invoker(Path(home))(*args)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_pushed_pulled_by_digest_and_run_without_transformers(hf_bundles: dict[str, Path], hf_home: Path) -> None:
    """The examples' own steps: push, pull pinned, then one fresh process runs all three with
    transformers never imported (checked there, over all of sys.modules)."""
    sys.path.insert(0, str(ROOT))
    from examples.hf_models import publish_and_pull, run_without_transformers

    cases, chain = [], None
    for model, (name, model_chain, _) in MODELS.items():
        ref, pulled = publish_and_pull(hf_home, hf_bundles[model], name, cli=_cli)
        assert pulled.read_bytes() == hf_bundles[model].read_bytes()
        cases.append((ref, hf_bundles[model]))
        chain = chain or model_chain
    report = run_without_transformers(hf_home, cases, chain=chain)
    assert report["transformers_imported"] is False
    for (ref, _), (name, _, expected) in zip(cases, MODELS.values()):  # noqa: B007
        for prog, (cls, fields) in expected.items():
            got = report["refs"][ref][prog]
            assert got["type"] == cls and got["fields"] == fields and got["attributes_ok"], got
            assert got["ok"] and max(got["max_abs_error"].values()) <= 1e-4, got


def test_verify_says_stand_in(hf_bundles: dict[str, Path], hf_home: Path) -> None:
    pt2reg = invoker(hf_home)
    r = pt2reg("verify", hf_bundles["gpt2"], "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    codes = {f["code"] for f in doc["findings"]}
    if "transformers.modeling_outputs" not in sys.modules and not _registered(MODELS["gpt2"][2]["lm"][0]):
        assert "pytree-stand-in" in codes, doc["findings"]


def _registered(name: str) -> bool:
    from registry.runtime.torchrt import pytree_registered

    return pytree_registered(name)


def _fixture_bundles(request: pytest.FixtureRequest) -> dict[str, Path]:
    found = {k: v for k, v in request.getfixturevalue("bundles").items() if k in ("ed", "v0")}
    found.update({f"hf-{k}": v for k, v in request.getfixturevalue("hf_bundles").items()})
    # the loader tests' models: an unregistered custom op (exit 4), a pickled tensor (exit 5),
    # a baked-in device, and the encoder/decoder with derived dims (the AOTInductor one is left
    # out: compiling it costs half a minute per worker)
    for name in ("encdec", "custom_op", "pickled", "baked"):
        found[name] = request.getfixturevalue(name).path
    return found


def test_verify_and_load_agree_on_every_fixture_bundle(request: pytest.FixtureRequest, tmp_path: Path) -> None:
    """Anything the loader fails on, verify reports first: same verdict, same exit code."""
    pt2reg = invoker(tmp_path / "home")
    for name, path in _fixture_bundles(request).items():
        v = pt2reg("verify", path)
        r = pt2reg("run", path, "--samples")
        assert (v.exit_code == 0) == (r.exit_code == 0), (name, v.output, r.output)
        if v.exit_code == 4:
            assert r.exit_code == 4, (name, r.output)


# -- classes the registry cannot stand in for: exit 4 naming the module, never "damaged" ----------

_NT_SPEC = json.dumps([1, {"type": "collections.namedtuple", "context": "mylib.outputs.Pair",
                           "children_spec": [{"type": None, "context": None, "children_spec": []}] * 2}])
_OPAQUE_SPEC = json.dumps([1, {"type": "mylib.outputs.Opaque", "context": "\"x\"",
                               "children_spec": [{"type": None, "context": None, "children_spec": []}]}])
_DC_SPEC = json.dumps([1, {"type": "mylib.outputs.DC", "context": "[[\"a\"], [\"b\"]]",
                           "children_spec": [{"type": None, "context": None, "children_spec": []}]}])


def test_unstandable_class_is_exit_4_naming_the_module() -> None:
    from types import SimpleNamespace

    from registry.format.manifest import ProgramSpec
    from registry.pt2.treespec import leaf_paths, pytree_classes
    from registry.runtime.compat import pytree_class_rule

    assert pytree_classes(_NT_SPEC) == [{"type": "mylib.outputs.Pair", "fields": None, "style": None}]
    assert pytree_classes(_OPAQUE_SPEC)[0]["fields"] is None
    assert pytree_classes(_DC_SPEC) == [{"type": "mylib.outputs.DC", "fields": ["a", "b"], "style": "dataclass"}]
    assert leaf_paths(_DC_SPEC) == ["['a']"]
    for spec in (_NT_SPEC, _OPAQUE_SPEC):
        manifest = SimpleNamespace(programs={"m": ProgramSpec("m", (), (), (), (), (), (), (), (), None,
                                                              in_spec=None, out_spec=spec)})
        (finding,) = pytree_class_rule(manifest, None, None)
        assert finding.severity == "error" and finding.code == "pytree-class"
        assert "--import mylib.outputs" in finding.fix


def test_torch_pytree_failure_is_incompatible_not_damaged() -> None:
    from registry.errors import IncompatibleError
    from registry.runtime.torchrt import torch_loading

    with pytest.raises(IncompatibleError) as info:
        with torch_loading("program 'm'", "damaged"):
            raise NotImplementedError("Deserializing mylib.outputs.Opaque in pytree is not registered.")
    assert info.value.exit_code == 4 and "--import mylib.outputs" in str(info.value.hint)


def test_dataclass_stand_in_round_trips() -> None:
    import torch
    from torch.utils import _pytree as pytree

    from registry.pt2.treespec import pytree_classes
    from registry.runtime.torchrt import stand_in_pytree_classes

    stand_in_pytree_classes(pytree_classes(_DC_SPEC))
    spec = pytree.treespec_loads(_DC_SPEC)
    out = pytree.tree_unflatten([torch.ones(2)], spec)
    assert out.a.shape == (2,) and out.b is None and out["a"] is out.a
    leaves, again = pytree.tree_flatten(out)
    assert len(leaves) == 1 and pytree.treespec_dumps(again) == pytree.treespec_dumps(spec)
