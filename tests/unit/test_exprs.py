import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from registry.pt2.exprs import INF, ExprError, parse_srepr

SYM = "Symbol('s27', positive=True, integer=True)"


@pytest.mark.parametrize("srepr,printed,bounds", [
    (SYM, "s27", (2, 16)),
    (f"Add({SYM}, Integer(1))", "s27 + 1", (3, 17)),
    (f"Add({SYM}, Integer(-1))", "s27 - 1", (1, 15)),
    (f"Mul(Integer(2), {SYM})", "2*s27", (4, 32)),
    (f"FloorDiv({SYM}, Integer(2))", "s27//2", (1, 8)),
])
def test_render_and_bounds(srepr, printed, bounds):
    e = parse_srepr(srepr)
    assert e.render() == printed
    assert e.bounds({"s27": (2, 16)}) == bounds
    assert e.render({"s27": "seq"}) == printed.replace("s27", "seq")


def test_evaluate():
    e = parse_srepr(f"Add(Mul(Integer(2), {SYM}), Integer(1))")
    assert e.evaluate({"s27": 5}) == 11
    assert e.evaluate({}) is None


@pytest.mark.parametrize("bad", [
    "__import__('os').system('true')", "Symbol(", "Add()", "Lambda(x)", "Integer('1')",
    "A" * 5000, "Add(" * 100 + "Integer(1)" + ")" * 100,
])
def test_hostile_strings_rejected_without_eval(bad):
    with pytest.raises(ExprError):
        parse_srepr(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parser_only_raises_expr_error(text):
    try:
        parse_srepr(text)
    except ExprError:
        pass


def test_powers_and_other_functions_torch_writes_are_described_not_refused():
    sq = parse_srepr("Pow(Symbol('s27', positive=True, integer=True), Integer(2))")
    assert (sq.render(), sq.bounds({"s27": (2, 10)}), sq.evaluate({"s27": 3})) == ("s27**2", (4, 100), 9)
    pw = parse_srepr("Piecewise(ExprCondPair(Add(Symbol('s77', positive=True, integer=True), Integer(-1)), "
                     "StrictGreaterThan(Symbol('s77', positive=True, integer=True), Integer(4))), "
                     "ExprCondPair(Symbol('s77', positive=True, integer=True), true))")
    assert pw.symbols() == {"s77"} and pw.bounds({"s77": (2, 9)}) == (0, INF)
    assert pw.evaluate({"s77": 5}) is None and pw.render().startswith("Piecewise(")
