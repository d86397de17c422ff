"""The checker rejects invalid μGraphs, and its message says what is wrong and where."""
from __future__ import annotations

import re
from dataclasses import replace

import pytest

from superopt.ir import (BlockInput, BlockOutput, GraphError, KernelGraph, Node, TensorType, Value, check,
                         make_attrs)
from superopt.lax import Program
from superopt.ir.shapes import ShapeError

from tests.fixtures.graphs import V, rmsnorm_matmul

B, K, N = 3, 96, 80


def base() -> KernelGraph:
    return rmsnorm_matmul(B, K, N, 4, 3)


def with_block(g: KernelGraph, **changes) -> KernelGraph:
    node = g.nodes[0]
    return replace(g, nodes=(replace(node, block=replace(node.block, **changes)),) + g.nodes[1:], _types=None)


def with_nodes(g: KernelGraph, edit) -> KernelGraph:
    return with_block(g, nodes=tuple(edit(n) for n in g.nodes[0].block.nodes))


def rejects(g: KernelGraph, *fragments: str, arch: str = "sm_90") -> str:
    with pytest.raises(GraphError) as e:
        check(g, arch)
    msg = str(e.value)
    for f in fragments:
        assert re.search(f, msg), f"{f!r} not in {msg!r}"
    return msg


def test_base_graph_is_valid():
    assert check(base()) is not None


def test_tiles_that_do_not_divide():
    g = base()
    blk = g.nodes[0].block
    # grid y = 3 does not divide N = 80
    bad = with_block(g, grid=(1, 3, 1))
    rejects(bad, r"block input %wt", r"dim 1 of size 80 is not divisible by grid axis y of extent 3")
    # the for-loop range 5 does not divide the K chunk of 96
    rejects(with_block(g, forloop=5), r"dim 1 chunk of size 96 is not divisible by the for-loop range 5")
    assert blk.forloop == 3


def test_imap_on_a_missing_dim():
    g = base()
    blk = g.nodes[0].block
    wt = blk.inputs[1]
    bad = with_block(g, inputs=(blk.inputs[0], replace(wt, imap=(-1, 2, -1))))
    rejects(bad, r"imap maps grid axis y to dim 2, but the tensor \[96, 80\] has rank 2")
    bad = with_block(g, inputs=(replace(blk.inputs[0], fmap=4), wt))
    rejects(bad, r"fmap 4 is not a dim of the tensor \[3, 96\]")


def test_shared_memory_over_budget_on_sm90():
    # x[3, 3000] @ w[3000, 5] in one block: 96 KB of real tiles, but Triton pads the dot to
    # [16, 4096] @ [4096, 16] and stages both operands in shared memory: 512 KB at any num_stages
    p = Program("big")
    x, w = p.input("x", (3, 3000)), p.input("w", (3000, 5))
    p.output(p.matmul(x, w))
    prog = p.build()
    blk = replace(base().nodes[0].block, grid=(1, 1, 1), forloop=1, thread_groups=(),
                  inputs=(BlockInput(V("xt", (3, 3000)), 0, (-1, -1, -1), -1),
                          BlockInput(V("wt", (3000, 5)), 1, (-1, -1, -1), -1)),
                  nodes=(Node("matmul", ("xt", "wt"), (V("s", (3, 5)),)),),
                  outputs=(BlockOutput("s", (-1, -1, -1)),))
    g = KernelGraph(prog.inputs, (Node("customized", ("x", "w"), (V("out", (3, 5)),), (), blk),), ("out",))
    rejects(g, r"needs 524288 bytes of shared memory \(padded tiles, 1 stage\); sm_90 allows 232448")
    rejects(g, r"sm_89 allows 101376", arch="sm_89")
    # an elementwise tile lives in registers: a [256, 256] exp needs no shared memory at all
    e = Program("exp")
    y = e.input("y", (256, 256))
    e.output(e.exp(y))
    eb = replace(blk, inputs=(BlockInput(V("yt", (256, 256)), 0, (-1, -1, -1), -1),),
                 nodes=(Node("exp", ("yt",), (V("ex", (256, 256)),)),), outputs=(BlockOutput("ex", (-1, -1, -1)),))
    ge = KernelGraph(e.build().inputs, (Node("customized", ("y",), (V("o", (256, 256)),), (), eb),), ("o",))
    assert check(ge) is ge


def test_dtype_mismatch():
    g = base()
    half_eps = Node("const", (), (Value("eps", TensorType((), "float16")),), make_attrs(value=1e-6, dtype="float16"))
    bad = with_nodes(g, lambda n: half_eps if n.out.name == "eps" else n)
    rejects(bad, r"node add -> %mse", r"operand dtypes differ \(float32 vs float16\); insert a cast")
    p = Program("mix")
    a, b = p.input("a", (4,), "float32"), p.input("b", (4,), "bfloat16")
    with pytest.raises(ShapeError, match=r"add: operand dtypes differ \(float32 vs bfloat16\)"):
        p.add(a, b)


def test_output_that_varies_with_the_loop():
    g = base()
    blk = g.nodes[0].block
    bad = with_block(g, outputs=(BlockOutput("s", (-1, 1, -1)),))
    rejects(bad, r"output %s changes with the for-loop; accumulate it first")
    assert blk.outputs[0].value == "y"


def test_accumulating_a_loop_invariant():
    # a tile the for-loop does not walk (fmap -1), accumulated: rejected by the variance rules
    p = Program("inv")
    x = p.input("x", (4, 8))
    p.output(p.sum(x, 0, keepdim=True))
    prog = p.build()
    blk = replace(base().nodes[0].block, grid=(1, 1, 1), forloop=2, thread_groups=(),
                  inputs=(BlockInput(V("xt", (4, 8)), 0, (-1, -1, -1), -1),),
                  nodes=(Node("accum_sum", ("xt",), (V("a", (4, 8)),)),
                         Node("reduce_sum", ("a",), (V("r", (1, 8)),), make_attrs(dim=0, keepdim=1))),
                  outputs=(BlockOutput("r", (-1, -1, -1)),))
    g = KernelGraph(prog.inputs, (Node("customized", ("x",), (V("out", (1, 8)),), (), blk),), ("out",))
    rejects(g, r"block node accum_sum -> %a: accumulates %xt, which does not change with the for-loop")


def test_reduce_none_on_an_unmapped_axis():
    g = base()
    blk = g.nodes[0].block
    out_node = g.nodes[0]
    bad = replace(g, nodes=(replace(out_node, outs=(V("out", (B, N // 4)),),
                                    block=replace(blk, outputs=(BlockOutput("y", (-1, -1, -1)),))),),
                  _types=None)
    rejects(bad, r"output %y: grid axes \(1,\) of extent > 1 do not tile it; map them in omap or declare reduce sum")
    ok = replace(bad, nodes=(replace(bad.nodes[0], block=replace(
        bad.nodes[0].block, outputs=(BlockOutput("y", (-1, -1, -1), "sum"),))),), _types=None)
    assert check(ok) is ok


def test_undefined_values_wrong_output_shape_and_thread_count():
    g = base()
    rejects(replace(g, outputs=("nope",)), r"graph outputs: operand %nope is not defined before use")
    # accumulating a value computed after the loop: it is not defined yet where the loop runs
    bad = with_nodes(g, lambda n: replace(n, args=("rs",)) if n.out.name == "as" else n)
    rejects(bad, r"node accum_sum -> %as: operand %rs is not defined before use")
    node = g.nodes[0]
    rejects(replace(g, nodes=(replace(node, outs=(V("out", (B, N + 4)),)),), _types=None),
            r"output %y writes float32\[3, 80\] but the op declares float32\[3, 84\]")
    rejects(with_block(g, block_threads=100), r"100 threads; expected a multiple of 32 in \[32, 1024\]")
