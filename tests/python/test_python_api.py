"""The Python package's face (SPEC §2): a typed, documented function per op that calls torch.ops.cuops.*,
so eager code, torch.compile, torch.export and TorchScript see the registered ops; and the one rule that
finds the library in a source checkout ($CUOPS_LIBRARY, else $CUOPS_BUILD_DIR/libcuops.so, else
<repo>/build/libcuops.so). conftest imported cuops from <repo>/python; one process holds one cuops
library, so another library path is tried only in a subprocess."""
import inspect
import io
import os
import pathlib
import pydoc
import subprocess
import sys
import textwrap
import typing

import pytest
import torch
import torch._dynamo.testing

from conftest import DEVICES, DEVICES_CPU_IN_CI, DTYPES, LIBRARY, ROOT, make, ops

import cuops
from cuops import _library

TENSOR_OPS = ["add2", "vector_add", "scale", "square", "two_norm", "gemm", "mm", "linear", "swiglu", "lora_linear",
              "lora_swiglu", "rms_norm", "add_rms_norm", "rotary", "linear_cross_entropy", "grouped_mm",
              "moe_topk_softmax", "moe_experts"]
# Ops whose names start with "_" are internal (an op's pieces for its backward): no typed function.
SCHEMAS = {s.name.split("::")[1]: s for s in torch._C._jit_get_all_schemas()
           if s.name.startswith("cuops::") and not s.name.split("::")[1].startswith("_")}
PY_TYPE = {"Tensor": torch.Tensor, "float": float, "int": int, "str": str, "bool": bool,
           "Optional[Tensor]": typing.Optional[torch.Tensor], "Optional[int]": typing.Optional[torch.dtype],  # ScalarType?
           "Optional[float]": typing.Optional[float]}


def test_help_mm_shows_the_signature_and_the_contract():
    text = pydoc.render_doc(cuops.mm, renderer=pydoc.plaintext)  # what help(cuops.mm) prints
    assert "mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor" in text, text
    for words in ["[M, K]", "[K, N]", "float32", "bfloat16", "torch.get_float32_matmul_precision()", "grad_a",
                  '"cuops::mm: ..."', "torch.ops.cuops.mm", "docs/ops.md#mm"]:
        assert words in text, f"{words!r} not in help(cuops.mm):\n{text}"
    sig = inspect.signature(cuops.mm)
    assert list(sig.parameters) == ["a", "b"]
    assert all(p.annotation is torch.Tensor for p in sig.parameters.values())
    assert sig.return_annotation is torch.Tensor


def test_every_op_has_a_typed_documented_function_matching_its_schema():
    assert set(SCHEMAS) == set(TENSOR_OPS) | {"build_info", "set_switch"}, "an op without a typed function, or a stale one"
    for name in TENSOR_OPS:
        fn, schema = getattr(cuops, name), SCHEMAS[name]
        assert inspect.isfunction(fn) and fn.__module__ == "cuops", name
        params = list(inspect.signature(fn).parameters.values())
        assert [p.name for p in params] == [a.name for a in schema.arguments], name
        for p, a in zip(params, schema.arguments):
            assert p.annotation == PY_TYPE[str(a.type)], (name, p.name)
            assert p.default == (a.default_value if a.has_default_value() else inspect.Parameter.empty), (name, p.name)
        returns = inspect.signature(fn).return_annotation
        if len(schema.returns) > 1:
            assert typing.get_origin(returns) is tuple and typing.get_args(returns) == tuple(
                PY_TYPE[str(r.type)] for r in schema.returns), name
        else:
            assert returns is (PY_TYPE[str(schema.returns[0].type)] if schema.returns else None), name
        doc = inspect.getdoc(fn)
        for words in [f'"cuops::{name}: ..."', f"torch.ops.cuops.{name}", f"docs/ops.md#{name}", "float32",
                      "float64", "float16", "bfloat16", "Autograd:"]:
            assert words in doc, f"{words!r} not in cuops.{name}'s docstring"
    assert "get_float32_matmul_precision()" in inspect.getdoc(cuops.gemm)
    assert typing.get_origin(inspect.signature(cuops.build_info).return_annotation) is dict
    assert "cuda_archs" in inspect.getdoc(cuops.build_info) and "CUOPS_BUILD_DIR" in inspect.getdoc(cuops)


def test_public_names_and_no_forwarding_of_unknown_names():
    assert set(TENSOR_OPS) | {"build_info", "set_switch", "switch", "ops", "library_path", "__version__"} <= set(
        cuops.__all__)
    assert all(hasattr(cuops, n) for n in cuops.__all__)
    assert cuops.ops is torch.ops.cuops
    with pytest.raises(AttributeError):
        cuops.link_anchor  # noqa: B018  (not an op: no module __getattr__ forwards names to torch.ops)
    assert (pathlib.Path(cuops.__file__).parent / "py.typed").is_file()  # PEP 561: checkers read the hints
    assert cuops.__version__ == cuops.build_info()["cuops_version"]


def test_switches_set_read_and_restore():
    """cuops.switch sets a switch for a block and restores it; set_switch reads it (no argument) or
    sets it; an unknown name is refused with the list of names. (Which path each switch selects:
    tests/python/test_gemm_sequences.py.)"""
    names = ["CUOPS_DISABLE_WGMMA", "CUOPS_DISABLE_SKINNY_TMA", "CUOPS_DISABLE_BULK_NORM"]
    for name in names:
        was = cuops.set_switch(name)
        with cuops.switch(name, not was):
            assert cuops.set_switch(name) is (not was)
        assert cuops.set_switch(name) is was
    with pytest.raises(RuntimeError, match="cuops::set_switch: expected name to be one of " + ", ".join(names)):
        cuops.set_switch("CUOPS_DISABLE_EVERYTHING", True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_typed_functions_give_the_bits_of_torch_ops(device, dtype):
    x, y = make((33, 17), dtype, device), make((33, 17), dtype, device, "transposed")
    w = make((17, 9), dtype, device)
    for name, args in [("vector_add", (x, y)), ("scale", (x,)), ("scale", (x, -0.5)), ("square", (y,)),
                       ("two_norm", (x, y)), ("mm", (x, w)), ("mm", (y, w))]:
        assert torch.equal(getattr(cuops, name)(*args), getattr(ops, name)(*args)), name
    for name, inputs in [("add2", (x, y)), ("gemm", (x, w)), ("gemm", (x, w, 0.5, 2.0))]:
        shape = x.shape if name == "add2" else (x.shape[0], w.shape[1])
        init = make(shape, dtype, device)
        ours, theirs = init.clone(), init.clone()
        assert getattr(cuops, name)(ours, *inputs) is None
        getattr(ops, name)(theirs, *inputs)
        assert torch.equal(ours, theirs), name


@pytest.mark.parametrize("device", DEVICES)
def test_typed_functions_keep_gradients_and_errors(device):
    a = torch.randn(5, 3, dtype=torch.float64, device=device, requires_grad=True)
    b = torch.randn(3, 4, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(cuops.mm, (a, b))
    assert torch.autograd.gradcheck(cuops.two_norm, (a, a.detach() + 1))
    with pytest.raises(RuntimeError, match=r"^cuops::mm: expected a and b to share the inner dimension"):
        cuops.mm(a, a)
    with pytest.raises(RuntimeError, match=r"^cuops::gemm: .*use cuops::mm"):
        cuops.gemm(torch.empty(5, 4, dtype=torch.float64, device=device), a, b)


class TypedModel(torch.nn.Module):
    """Every op through the typed functions."""

    def forward(self, a, b, w):
        c = torch.empty_like(a)
        cuops.add2(c, a, b)
        h = cuops.mm(cuops.square(cuops.vector_add(c, b)), w)
        g = torch.empty(h.shape[0], w.shape[1], dtype=h.dtype, device=h.device)
        cuops.gemm(g, cuops.scale(h, 0.25), w)
        target = torch.arange(g.shape[0], device=g.device) % w.shape[0]
        normed, s = cuops.add_rms_norm(g, h, w[0])
        rq, rk = cuops.rotary(g.view(1, 2, 4, 4), h.view(1, 2, 4, 4), w[None], w[None].flip(1))
        adapted = cuops.lora_swiglu(cuops.lora_linear(g, w, w[:2], w[:, :2], None, "silu", h), w, w, w[:2],
                                    w[:, 2:], w[:, :2])
        weights, experts = cuops.moe_topk_softmax(g, 2, True)
        gate_up = torch.stack([w, w.flip(0), w.flip(1), w.t()])
        offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32, device=g.device)
        moe = cuops.moe_experts(g, experts, weights, gate_up, gate_up[:, :, :2]) + cuops.grouped_mm(g, gate_up, offs)
        return (cuops.swiglu(cuops.linear(g, w, None, "gelu"), w, w) + adapted, cuops.two_norm(g, h),
                cuops.linear_cross_entropy(g, w, target), cuops.rms_norm(normed, w[1]) + s, rq + rk, moe)


def model_inputs(device):
    return torch.randn(8, 4, device=device), torch.randn(8, 4, device=device), torch.randn(4, 4, device=device)


@pytest.mark.parametrize("device", DEVICES_CPU_IN_CI)
def test_compile_fullgraph_traces_the_typed_functions_to_the_ops(device):
    torch._dynamo.reset()

    def f(a, b, w):
        return cuops.mm(cuops.vector_add(a, b), w)

    args = model_inputs(device)
    explanation = torch._dynamo.explain(f)(*args)
    assert explanation.graph_break_count == 0 and explanation.graph_count == 1
    assert "torch.ops.cuops.mm" in explanation.graphs[0].code, explanation.graphs[0].code
    torch.testing.assert_close(torch.compile(f, fullgraph=True)(*args), f(*args), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(TypedModel(), fullgraph=True)(*args), TypedModel()(*args),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_export_records_the_registered_ops(device):
    args = model_inputs(device)
    program = torch.export.export(TypedModel(), args)
    targets = {str(n.target) for n in program.graph.nodes if n.op == "call_function"}
    assert {f"cuops.{n}.default" for n in TENSOR_OPS} <= targets, targets
    torch.testing.assert_close(program.module()(*args), TypedModel()(*args))


def scripted_every_op(a: torch.Tensor, b: torch.Tensor, w: torch.Tensor):
    c = torch.empty_like(a)
    cuops.add2(c, a, b)
    h = cuops.mm(cuops.square(cuops.vector_add(c, b)), w)
    g = torch.empty([h.shape[0], w.shape[1]], dtype=h.dtype, device=h.device)
    cuops.gemm(g, cuops.scale(h, 0.25), w)
    target = torch.arange(g.shape[0], device=g.device) % w.shape[0]
    normed, s = cuops.add_rms_norm(g, h, w[0])
    rq, rk = cuops.rotary(g.view(1, 2, 4, 4), h.view(1, 2, 4, 4), w[None], w[None].flip(1))
    adapted = cuops.lora_swiglu(cuops.lora_linear(g, w, w[:2], w[:, :2], None, "silu", h), w, w, w[:2],
                                w[:, 2:], w[:, :2])
    weights, experts = cuops.moe_topk_softmax(g, 2, True)
    gate_up = torch.stack([w, w.flip(0), w.flip(1), w.t()])
    offs = torch.tensor([2, 4, 6, 8], dtype=torch.int32, device=g.device)
    moe = cuops.moe_experts(g, experts, weights, gate_up, gate_up[:, :, :2]) + cuops.grouped_mm(g, gate_up, offs)
    return (cuops.swiglu(cuops.linear(g, w, None, "gelu"), w, w) + adapted, cuops.two_norm(g, h),
            cuops.linear_cross_entropy(g, w, target), cuops.rms_norm(normed, w[1]) + s, rq + rk, moe)


@pytest.mark.filterwarnings(r"ignore:`torch\.jit\.\w+` is deprecated:DeprecationWarning")
@pytest.mark.parametrize("device", DEVICES)
def test_torchscript_scripts_through_the_typed_functions(device):
    """TorchScript compiles the typed functions too (their bodies are scriptable), so scripted code may
    call cuops.mm as eager code does; the saved archive carries them, and they call the registered ops."""
    scripted = torch.jit.script(scripted_every_op)
    graph = str(scripted.inlined_graph)
    for name in TENSOR_OPS:
        assert f"cuops::{name}(" in graph, graph
    buffer = io.BytesIO()
    torch.jit.save(scripted, buffer)
    buffer.seek(0)
    loaded = torch.jit.load(buffer)
    args = model_inputs(device)
    torch.testing.assert_close(loaded(*args), scripted_every_op(*args))


def test_library_path_is_the_loaded_library():
    assert cuops.library_path == str(LIBRARY) and LIBRARY.is_absolute() and LIBRARY.is_file()
    assert pathlib.Path(cuops.library_path) == _library.find_build_library()


def test_source_checkout_rule(tmp_path, monkeypatch):
    find = _library.find_build_library
    assert find({}) == ROOT / "build" / "libcuops.so"
    assert find({"CUOPS_BUILD_DIR": "/elsewhere"}) == pathlib.Path("/elsewhere/libcuops.so")
    assert find({"CUOPS_LIBRARY": "/x/lib.so", "CUOPS_BUILD_DIR": "/elsewhere"}) == pathlib.Path("/x/lib.so")
    assert find({"CUOPS_LIBRARY": "", "CUOPS_BUILD_DIR": ""}) == ROOT / "build" / "libcuops.so"  # empty = unset
    monkeypatch.chdir(tmp_path)
    assert find({"CUOPS_BUILD_DIR": "b"}) == tmp_path / "b" / "libcuops.so"


def test_import_in_a_fresh_process_follows_the_environment(tmp_path):
    """A missing library names its path and the build command; CUOPS_BUILD_DIR elsewhere is loaded from
    there. Both in one subprocess: the failed import loads nothing, so the second import starts clean."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "libcuops.so").symlink_to(LIBRARY.resolve())
    missing = tmp_path / "nowhere" / "libcuops.so"
    env = {k: v for k, v in os.environ.items() if k not in ("CUOPS_LIBRARY", "CUOPS_BUILD_DIR")}
    env.update(PYTHONPATH=str(ROOT / "python"), CUOPS_LIBRARY=str(missing))
    code = textwrap.dedent(f"""
        import os
        try:
            import cuops
        except ImportError as e:
            print("ImportError:", e)
        else:
            raise SystemExit("imported without a library")
        del os.environ["CUOPS_LIBRARY"]
        os.environ["CUOPS_BUILD_DIR"] = {str(elsewhere)!r}
        import torch, cuops
        assert cuops.library_path == {str(elsewhere / "libcuops.so")!r}, cuops.library_path
        assert cuops.__version__ == cuops.build_info()["cuops_version"]
        a = torch.randn(65, 33)
        assert torch.equal(cuops.vector_add(a, a), a + a)
        print("loaded", cuops.library_path)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"ImportError: cuops: no library at {missing}" in proc.stdout, proc.stdout
    assert "bash tools/build.sh" in proc.stdout, proc.stdout
    assert f"loaded {elsewhere / 'libcuops.so'}" in proc.stdout, proc.stdout
