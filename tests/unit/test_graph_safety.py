"""The allowlists that stand between a graph JSON and torch's eval/getattr (registry.pt2.safety)."""
import pytest

from registry.pt2.safety import GraphSafetyError, check_srepr, check_target, unsafe_in_graph

TORCH_WRITES = [
    "Symbol('s27', positive=True, integer=True)",
    "Add(Symbol('s27', positive=True, integer=True), Integer(1))",
    "Mul(Integer(2), Symbol('s3', integer=True, positive=True))",
    "FloorDiv(Symbol('s0', integer=True), Integer(2))",
    "PowByNatural(Symbol('s0', integer=True), Integer(2))",
    "Max(Integer(2), Symbol('s1'))", "Integer(-1)", "-oo", "int_oo", "-int_oo", "true",
    "Float('1.5', precision=53)", "Rational(1, 2)", "FloatPow(Symbol('zf0'), Float('0.5', precision=53))",
    "StrictLessThan(Symbol('s0'), Integer(3))", "Equality(Mod(Symbol('u0'), Integer(4)), Integer(0))",
    "And(LessThan(Integer(2), Symbol('s0')), Unequality(Symbol('s0'), Integer(7)))",
    "BitwiseFn_bitwise_xor(Symbol('s0', integer=True), Integer(1))", "OpaqueUnaryFn_asinh(Symbol('zf0'))",
    "Piecewise(ExprCondPair(Add(Symbol('s77', positive=True, integer=True), Integer(-1)), "
    "StrictGreaterThan(Symbol('s77', positive=True, integer=True), Integer(4))), "
    "ExprCondPair(Symbol('s77', positive=True, integer=True), true))",
    "Pow(Symbol('s27', positive=True, integer=True), Integer(2))",
]
HOSTILE = [
    "__import__('os').system('id')", "Symbol('x').__class__", "eval('1')", "lambda: 1",
    "Symbol('__globals__')", "Float('1e5);import os')", "Symbol('s0', integer=os)",
    "Add(Integer(1), Integer(2)) Integer(3)", "Mod(Integer(1))[0]", "Symbol('a' 'b')",
    "Pow(Integer(10), Integer(100000000))", "Pow(Integer(2), Pow(Integer(64), Integer(64)))",
    "PowByNatural(Integer(2), Mul(Integer(64), Integer(64)))", "Integer(" + "9" * 100 + ")",
    "Symbol(\"x\\\")", "Add(" * 100 + "Integer(1)" + ")" * 100, "Function('f')(Symbol('x'))",
    "Integer(1);import os", "Symbol('x')\nimport os", "", 7, None, "OpaqueUnaryFn_(Symbol('x'))",
    "BitwiseFn_bitwise_xor.__globals__", "exec(Symbol('x'))", "getattr(Symbol('x'), Symbol('y'))",
]


@pytest.mark.parametrize("text", TORCH_WRITES)
def test_what_torch_writes_is_accepted(text):
    check_srepr(text)


@pytest.mark.parametrize("text", HOSTILE)
def test_anything_else_is_refused(text):
    with pytest.raises(GraphSafetyError):
        check_srepr(text)


@pytest.mark.parametrize("target", [
    "torch.ops.aten.add.Tensor", "torch.ops._c10d_functional.all_reduce.default",
    "torch.ops.mylib.scale.default", "torch.ops.higher_order.cond", "_operator.getitem",
    "_operator.floordiv", "torch.sym_max", "torch._sym_sqrt", "math.trunc", "#myext:my_op",
    "torch._C._set_grad_enabled", "torch.amp.autocast_mode._enter_autocast",
    "torch._functorch.predispatch._add_batch_dim",
    "torch.ops.aten.__and__.Tensor", "torch.ops.aten.__or__.Tensor", "torch.ops.aten.__xor__.Tensor",
    "torch.ops.aten.__lshift__.Scalar", "torch.ops.aten.__rshift__.Scalar", "torch.ops.aten.__ior__.Tensor",
    "torch.ops.aten.__iand__.Tensor",
])
def test_operator_targets_are_accepted(target):
    check_target(target)


@pytest.mark.parametrize("target", [
    "torch.os.system", "torch.ops.load_library", "torch.ops.import_module", "torch.ops.import_module.x.y",
    "torch.ops.higher_order.cond.py_impl", "torch.utils.cpp_extension.load_inline", "_operator.attrgetter",
    "_operator.methodcaller", "torch.ops.aten.add.__call__", "builtins.eval", "torch.ops.loaded_libraries.add.x",
    "torch.load", "torch.hub.load", "torch._functorch.predispatch.torch.os.system", "torch.serialization.pickle.loads",
    "math", "torch", "", 3, "torch.ops.aten.__and__.__call__", "torch.ops.aten.__class__.mro",
    "torch.ops.aten.__dict__.clear", "torch.ops.mylib.__and__.Tensor", "torch.ops.aten.__and__.__self__",
])
def test_other_targets_are_refused(target):
    with pytest.raises(GraphSafetyError):
        check_target(target)


def test_whole_graph_walk_finds_nested_payloads():
    sub = {"nodes": [{"name": "n", "target": "torch.os.system", "inputs": [], "outputs": []}]}
    model = {"graph_module": {"graph": {"nodes": [
        {"name": "c", "target": "torch.ops.higher_order.cond", "inputs": [{"arg": {"as_graph": {"graph": sub}}}],
         "outputs": []}]}}}
    assert "torch.os.system" in unsafe_in_graph(model)
    deep = {"a": [{"b": {"sym_int": {"as_expr": {"expr_str": "__import__('os')", "hint": None}}}}]}
    assert "not allowed" in unsafe_in_graph(deep)
    assert "implausible" in unsafe_in_graph({"range_constraints": {"u99999999999": {"min_val": 0}}})
    assert unsafe_in_graph({"range_constraints": {"s27 + 1": {}, "u3": {}}}) is None


def _pt2(path, members):
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(f"archive/{name}", data)
    return path


def test_graph_json_that_would_balloon_in_memory_is_refused_before_parsing(tmp_path):
    import tracemalloc

    from registry.errors import UnsafeArchiveError
    from registry.pt2.reader import open_pt2

    path = _pt2(tmp_path / "bomb.pt2", {"models/model.json": b"[" + b"[]," * 4_100_000 + b"[]]"})
    tracemalloc.start()
    with pytest.raises(UnsafeArchiveError, match="over the limits"):
        open_pt2(path)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 1024 * 1024  # the 12 MB member is read, never expanded to ~400 MB


@pytest.mark.parametrize("members, needle", [
    ({"models/model.json": b"{}", "Models/model.json": b"{}"}, "differ only in case"),
    ({"models/model.json": b"{}", "DATA/sample_inputs/model.pt": b"x"}, "would be read by torch"),
    ({"models/model.json": b"{}", "models/a/b.json": b"{}"}, "unexpected member"),
    ({"models/model.json": b"{}", "models/readme.txt": b"x"}, "unexpected member"),
])
def test_names_torch_would_read_differently_are_refused(tmp_path, members, needle):
    from registry.errors import UnsafeArchiveError
    from registry.pt2.reader import open_pt2

    with pytest.raises(UnsafeArchiveError, match=needle):
        open_pt2(_pt2(tmp_path / "x.pt2", members))
