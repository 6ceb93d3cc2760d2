"""Input validation before the graph runs: one line naming input, dim, Dim name, range, value."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from registry.errors import InputValidationError
from registry.format.manifest import TensorSpec
from registry.pt2.exprs import ExprError, parse_dim_expr
from registry.runtime.inputs import check_inputs, format_range, value_meta


def specs(entries: list[dict]) -> list[TensorSpec]:
    """Manifest ``inputs`` entries, as the manifest parses them."""
    return [TensorSpec.from_json(e) for e in entries]


BATCH = {"min": 1, "max": 8, "expr": "s24", "dim": "batch"}
SEQ = {"min": 2, "max": 16, "expr": "s81", "dim": "seq"}
SEQ1 = {"min": 3, "max": 17, "expr": "s81 + 1", "dim": "seq + 1"}
ENCODER = specs([{"name": "tokens", "dtype": "int64", "shape": [BATCH, SEQ]}])
DECODER = specs([{"name": "hidden", "dtype": "float32", "shape": [BATCH, SEQ, 8]},
                 {"name": "targets", "dtype": "int64", "shape": [BATCH, SEQ1]}])


def fail(spec, values, **kw) -> InputValidationError:
    with pytest.raises(InputValidationError) as exc:
        check_inputs(spec, values, **kw)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 4
    return exc.value


def tensor(dtype: str, *shape: int, device: str = "cpu") -> SimpleNamespace:
    """Duck-typed tensor: the checker needs only dtype, shape and device."""
    return SimpleNamespace(dtype=f"torch.{dtype}", shape=shape, device=device)


def test_valid_inputs_return_symbol_values():
    assert check_inputs(DECODER, [("float32", (2, 5, 8)), ("int64", (2, 6))]) == {"s24": 2, "s81": 5}
    assert check_inputs(ENCODER, [tensor("int64", 8, 16)]) == {"s24": 8, "s81": 16}


def test_too_long_sequence_names_input_dim_name_and_range():
    e = fail(ENCODER, [("int64", (4, 40))])
    assert str(e) == "input 'tokens' dim 1 (seq) is 40, allowed 2..16"
    assert (e.input_name, e.dim) == ("tokens", 1)


def test_bad_batch_size():
    assert str(fail(ENCODER, [("int64", (9, 4))])) == "input 'tokens' dim 0 (batch) is 9, allowed 1..8"
    assert str(fail(ENCODER, [("int64", (0, 4))])) == "input 'tokens' dim 0 (batch) is 0, allowed 1..8"


def test_wrong_dtype_names_both_dtypes():
    assert str(fail(ENCODER, [tensor("float32", 2, 4)])) == "input 'tokens' has dtype float32, expected int64"


def test_wrong_rank_and_static_dim():
    assert str(fail(DECODER, [("float32", (2, 5)), ("int64", (2, 6))])) == \
        "input 'hidden' has 2 dims [2, 5], expected 3 [batch, seq, 8]"
    assert str(fail(DECODER, [("float32", (2, 5, 7)), ("int64", (2, 6))])) == "input 'hidden' dim 2 is 7, expected 8"


def test_wrong_count():
    assert str(fail(DECODER, [("float32", (2, 5, 8))])) == "the program takes 2 input(s) (hidden, targets), got 1"


def test_shared_symbol_must_agree_across_inputs():
    e = fail(DECODER, [("float32", (2, 5, 8)), ("int64", (3, 6))])
    assert str(e) == "input 'targets' dim 0 (batch) is 3, but input 'hidden' dim 0 is 2; they must be equal"


def test_derived_dim_must_equal_its_expression():
    e = fail(DECODER, [("float32", (2, 5, 8)), ("int64", (2, 7))])
    assert str(e) == "input 'targets' dim 1 (seq + 1) is 7, expected 6 because seq is 5 (from input 'hidden' dim 1)"


def test_derived_dim_first_solves_the_symbol():
    spec = list(reversed(DECODER))
    assert check_inputs(spec, [("int64", (2, 6)), ("float32", (2, 5, 8))]) == {"s24": 2, "s81": 5}
    e = fail(spec, [("int64", (2, 7)), ("float32", (2, 5, 8))])
    assert str(e) == "input 'hidden' dim 1 (seq) is 5, but input 'targets' dim 1 (seq + 1) is 7, so seq must be 6"


def test_derived_dim_range_is_checked_before_relations():
    e = fail(DECODER, [("float32", (2, 5, 8)), ("int64", (2, 20))])
    assert str(e) == "input 'targets' dim 1 (seq + 1) is 20, allowed 3..17"


def test_two_derived_dims_of_an_unseen_symbol():
    a = {"min": 3, "max": None, "expr": "s0 + 1"}
    b = {"min": 4, "max": None, "expr": "2*s0"}
    spec = specs([{"name": "x", "dtype": "float32", "shape": [a]}, {"name": "y", "dtype": "float32", "shape": [b]}])
    assert check_inputs(spec, [("float32", (5,)), ("float32", (8,))]) == {"s0": 4}
    e = fail(spec, [("float32", (5,)), ("float32", (10,))])
    assert "input 'y' dim 0 (2*s0) is 10, expected 8" in str(e)


def test_unbounded_and_unnamed_dims():
    spec = specs([{"name": "x", "dtype": "float32", "shape": [{"min": 2, "max": None, "expr": "s3"}]}])
    assert str(fail(spec, [("float32", (1,))])) == "input 'x' dim 0 is 1, allowed >= 2"
    assert check_inputs(spec, [("float32", (10 ** 6,))]) == {"s3": 10 ** 6}


def test_device_is_checked_when_given():
    e = fail(ENCODER, [tensor("int64", 2, 4, device="cpu")], device="cuda:0")
    assert str(e) == "input 'tokens' is on cpu, the program runs on cuda:0"
    check_inputs(ENCODER, [tensor("int64", 2, 4, device="cuda:0")], device="cuda")


def test_non_tensor_inputs():
    spec = specs([{"name": "scale", "dtype": "float", "shape": None, "value": 2.0},
                  {"name": "n", "dtype": "int", "shape": None},
                  {"name": "opt", "dtype": "none", "shape": None}])
    check_inputs(spec, [2.0, 3, None])
    assert "exported with the constant 2.0" in str(fail(spec, [3.0, 3, None]))
    assert str(fail(spec, [2.0, True, None])) == "input 'n' must be a int, got bool"
    assert str(fail(spec, [2.0, 3, 1])) == "input 'opt' must be None, got int"
    assert str(fail(ENCODER, [5])) == "input 'tokens' must be a int64 tensor of shape [batch, seq], got int"


def test_value_meta_and_format_range():
    assert value_meta(("float32", [2, 3])) == ("float32", (2, 3), None)
    assert value_meta(tensor("bfloat16", 1)) == ("bfloat16", (1,), "cpu")
    assert value_meta(3) is None
    assert format_range(2, 16) == "2..16" and format_range(0, None) == ">= 0"


@pytest.mark.parametrize("text, values, expected", [
    ("s27", {"s27": 4}, 4), ("s27 + 1", {"s27": 4}, 5), ("s27 - 1", {"s27": 4}, 3),
    ("2*s3", {"s3": 5}, 10), ("s0//2", {"s0": 9}, 4), ("s0 % 3", {"s0": 7}, 1),
    ("Max(s0, 4)", {"s0": 2}, 4), ("Min(s0, s1) + 2*(s1 - 1)", {"s0": 3, "s1": 5}, 11), ("-s0 + 10", {"s0": 3}, 7),
])
def test_parse_printed_expressions(text, values, expected):
    assert parse_dim_expr(text).evaluate(values) == expected


@pytest.mark.parametrize("text", ["", "s0 +", "__import__('os')", "s0 ** 2", "(s0", "foo(s0)"])
def test_parse_rejects_anything_else(text):
    with pytest.raises(ExprError):
        parse_dim_expr(text)


def test_unreadable_expression_is_range_checked_only():
    spec = specs([{"name": "x", "dtype": "float32", "shape": [{"min": 1, "max": 4, "expr": "sqrt(s0)"}]}])
    assert check_inputs(spec, [("float32", (3,))]) == {}
    assert "allowed 1..4" in str(fail(spec, [("float32", (5,))]))


@given(b=st.integers(1, 8), s=st.integers(2, 16))
def test_every_size_in_range_passes(b, s):
    assert check_inputs(DECODER, [("float32", (b, s, 8)), ("int64", (b, s + 1))]) == {"s24": b, "s81": s}


@given(b=st.integers(-3, 20), s=st.integers(-3, 30), t=st.integers(-3, 30))
def test_anything_else_fails_with_one_line(b, s, t):
    ok = 1 <= b <= 8 and 2 <= s <= 16 and t == s + 1
    try:
        check_inputs(DECODER, [("float32", (b, s, 8)), ("int64", (b, t))])
        assert ok
    except InputValidationError as e:
        assert not ok and "\n" not in str(e) and str(e).startswith("input '")


def test_bool_tensor_is_not_a_python_bool():
    """A bool *tensor* input (an attention mask) shares the dtype name with a Python bool."""
    from registry.runtime.inputs import check_inputs

    spec = specs([{"name": "mask", "dtype": "bool", "shape": [2, 3], "kind": "positional", "path": "args[0]"}])
    import torch

    check_inputs(spec, [torch.ones(2, 3, dtype=torch.bool)])
    with pytest.raises(InputValidationError, match="must be a bool tensor"):
        check_inputs(spec, [True])
