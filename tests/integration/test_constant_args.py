"""Arguments export bakes in (``None``, bool, int, float, str, tuples of them): shown by
``inspect``, refused with exit 4 naming the argument when another value is given on any input
path, and accepted when given with the exported value or left out -- in the API and the CLI."""
import json

import pytest
import torch

from registry.errors import InputValidationError

#: argument -> (exported value, a different value)
BAKED = {"mask": (None, torch.ones(2, 3)), "use_cache": (True, False), "k": (4, 5), "f": (0.25, 0.5),
         "s": ("b", "a"), "t": ((3, 4), (3, 5))}


class Baked(torch.nn.Module):
    def forward(self, x, mask=None, use_cache=False, k=3, f=0.5, s="a", t=(1, 2)):
        y = x * k * f
        if mask is not None:
            y = y + mask
        if use_cache:
            y = y + 1
        if s == "a":
            y = y - 1
        return y + t[0] * t[1]


class Mixed(torch.nn.Module):
    def forward(self, x, pair=None):
        return x * pair[1] + pair[0]


X = torch.arange(6, dtype=torch.float32).reshape(2, 3)
EXPORTED = {name: v for name, (v, _) in BAKED.items()}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """One positional and one keyword export, bundled once; the expected output."""
    from registry.bundler import ProgramInput, build_bundle

    d = tmp_path_factory.mktemp("baked")
    ep_pos = torch.export.export(Baked(), (X, *EXPORTED.values()))
    ep_kw = torch.export.export(Baked(), (X,), dict(EXPORTED))
    torch.export.save(ep_pos, d / "pos.pt2")
    torch.export.save(ep_kw, d / "kw.pt2")
    torch.export.save(torch.export.export(Mixed(), (X,), {"pair": (X, 3)}), d / "mixed.pt2")
    build_bundle(d / "b.pt2b", [ProgramInput("pos", d / "pos.pt2"), ProgramInput("kw", d / "kw.pt2"),
                                ProgramInput("mixed", d / "mixed.pt2")])
    expected = Baked()(X, **EXPORTED)
    return {"dir": d, "bundle": d / "b.pt2b", "expected": expected}


@pytest.fixture(scope="module")
def loaded(files, tmp_path_factory):
    from registry.client.sources import materialize_file
    from registry.runtime.loader import load_bundle

    return load_bundle(materialize_file(files["bundle"], tmp_path_factory.mktemp("cache")), device="cpu")


def _refused(exc_info, name, fixed, given):
    text = str(exc_info.value)
    assert f"{name!r} was fixed to {fixed!r}" in text and given in text, text


def test_inspect_shows_each_baked_argument_with_its_value(pt2reg, files):
    r = pt2reg("inspect", files["bundle"])
    assert r.exit_code == 0, r.output
    for program in ("pos", "kw"):
        section = r.stdout.split(f"program {program}")[1].split("program ")[0]
        consts = {line.split()[1]: line.split("= ", 1)[1].strip()
                  for line in section.splitlines() if line.startswith("const")}
        assert consts == {name: repr(v) for name, v in EXPORTED.items()}, section
    doc = json.loads(pt2reg("inspect", files["bundle"], "--json").stdout)
    for program, where in (("pos", "args"), ("kw", "kwargs")):
        consts = {c["name"]: (c["value"], c["path"]) for c in doc["programs"][program]["constant_inputs"]}
        assert consts["mask"][0] is None and consts["use_cache"][0] is True and consts["k"][0] == 4
        assert consts["f"][0] == 0.25 and consts["s"][0] == "b" and consts["t_0"][0] == 3, consts
        assert all(path.startswith(where) for _, path in consts.values()), consts


@pytest.mark.parametrize("program", ["pos", "kw"])
def test_api_same_value_or_none_works_and_another_value_is_refused(loaded, files, program):
    p = loaded[program]
    want = files["expected"]
    assert torch.allclose(p(X), want)
    assert torch.allclose(p(X, **EXPORTED), want)
    assert torch.allclose(p(X, use_cache=True, t=[3, 4]), want)
    if program == "pos":
        assert torch.allclose(p(X, *EXPORTED.values()), want)
    for name, (fixed, other) in BAKED.items():
        with pytest.raises(InputValidationError) as kw:
            p(X, **{name: other})
        _refused(kw, name, fixed, "tensor" if name == "mask" else repr(other))
        if program == "pos":
            values = [other if n == name else v for n, v in EXPORTED.items()]
            with pytest.raises(InputValidationError) as pos:
                p(X, *values)
            _refused(pos, name, fixed, "tensor" if name == "mask" else repr(other))


def _inputs(d, label, value):
    path = d / f"{label}.pt"
    torch.save(value, path)
    return path


def test_cli_inputs_tuple_and_dict(pt2reg, files, tmp_path):
    want = files["expected"]
    out = tmp_path / "y.pt"
    for label, program, value in (("x_only", "pos", (X,)), ("full", "pos", (X, *EXPORTED.values())),
                                  ("dict_x", "kw", {"x": X}), ("dict_full", "kw", {"x": X, **EXPORTED}),
                                  ("dict_pos", "pos", {"x": X, "use_cache": True, "t": (3, 4)})):
        r = pt2reg("run", files["bundle"], "--program", program, "--inputs", _inputs(tmp_path, label, value),
                   "--output", out)
        assert r.exit_code == 0, (label, r.output)
        (y,) = torch.load(out, weights_only=True)
        assert torch.allclose(y, want), label
    for name, (fixed, other) in BAKED.items():
        values = [other if n == name else v for n, v in EXPORTED.items()]
        for label, program, value in (("tuple", "pos", (X, *values)), ("dict", "kw", {"x": X, name: other}),
                                      ("dict", "pos", {"x": X, name: other})):
            r = pt2reg("run", files["bundle"], "--program", program,
                       "--inputs", _inputs(tmp_path, f"{label}_{name}", value))
            assert r.exit_code == 4, (name, label, program, r.output)
            assert f"{name!r} was fixed to {fixed!r}" in r.stderr, r.stderr


def test_bundle_sample_with_another_value_is_exit_4(pt2reg, files, tmp_path):
    d = files["dir"]
    good = _inputs(tmp_path, "good", {"x": X, "use_cache": True})
    r = pt2reg("bundle", f"kw={d / 'kw.pt2'}", f"pos={d / 'pos.pt2'}", "-o", tmp_path / "ok.pt2b",
               "--sample", f"kw={good}", "--sample", f"pos={_inputs(tmp_path, 'good_t', (X, *EXPORTED.values()))}")
    assert r.exit_code == 0, r.output
    r = pt2reg("run", tmp_path / "ok.pt2b", "--samples")
    assert r.exit_code == 0, r.output
    for name, (fixed, other) in BAKED.items():
        values = [other if n == name else v for n, v in EXPORTED.items()]
        for program, value in (("kw", {"x": X, name: other}), ("pos", (X, *values))):
            r = pt2reg("bundle", f"{program}={d / f'{program}.pt2'}", "-o", tmp_path / "bad.pt2b",
                       "--sample", f"{program}={_inputs(tmp_path, f'bad_{program}_{name}', value)}")
            assert r.exit_code == 4, (name, program, r.output)
            assert f"{name!r} was fixed to {fixed!r}" in r.stderr, r.stderr
            assert not (tmp_path / "bad.pt2b").exists()


def test_a_tuple_argument_of_a_tensor_and_a_baked_item(loaded, pt2reg, files, tmp_path):
    p, want = loaded["mixed"], X * 3 + X
    assert torch.allclose(p(X, pair=(X, 3)), want)
    assert torch.allclose(p.run({"x": X, "pair": (X, 3)})[0], want)
    assert torch.allclose(p.run((X, X, 3))[0], want) and torch.allclose(p.run((X, X))[0], want)
    for call in (lambda: p(X, pair=(X, 4)), lambda: p.run({"x": X, "pair": (X, 4)}), lambda: p.run((X, X, 4))):
        with pytest.raises(InputValidationError) as exc:
            call()
        assert "'pair_1' (kwargs['pair'][1]) was fixed to 3" in str(exc.value) and "got 4" in str(exc.value)
    r = pt2reg("run", files["bundle"], "--program", "mixed", "--inputs",
               _inputs(tmp_path, "mixed", {"x": X, "pair": (X, 4)}))
    assert r.exit_code == 4 and "kwargs['pair'][1]" in r.stderr, r.output
