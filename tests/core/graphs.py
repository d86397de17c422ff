"""Small hand-built programs and fused μGraphs (plus mutants) for the verifier's own tests.

``rmsnorm_matmul``: RMSNorm → matmul in one kernel, the division by the rms moved after the
matmul (as tests/fixtures/_example_rmsnorm_matmul.py.txt). ``online_softmax_av``: softmax(s) @ v
in one kernel whose for-loop walks the key axis with a running max and a rescaled sum (flash
attention's online softmax). Each builder takes ``mutant=`` to plant one named bug.
"""
from __future__ import annotations

from superopt.ir import BlockGraph, BlockInput, BlockOutput, KernelGraph, Node, TensorType, Value, check, make_attrs
from superopt.lax import Program

F32 = "float32"


def V(name: str, shape) -> Value:
    return Value(name, TensorType(tuple(shape), F32))


def rmsnorm_matmul_program(b: int, k: int, n: int) -> KernelGraph:
    p = Program("rmsnorm_matmul")
    x = p.input("x", (b, k))
    w = p.input("w", (k, n))
    p.output(p.matmul(p.rms_norm(x, eps=1e-6), w))
    return p.build()


RMSNORM_MUTANTS = ("forgot_div_d", "wrong_omap", "accum_max", "sub_swapped", "off_by_one_fmap")


def rmsnorm_matmul(b: int, k: int, n: int, grid_y: int, forloop: int, mutant: str | None = None) -> KernelGraph:
    """x [b, k] @ w [k, n] after RMSNorm of x; grid (1, grid_y, 1) tiles n, the loop walks k.

    Mutants: ``forgot_div_d`` (mean of squares without /k), ``wrong_omap`` (tiles written along
    the wrong output dim; needs grid_y·(n/grid_y) shapes where that still type-checks: b == n/grid_y),
    ``accum_max`` (the matmul partials accumulated with max), ``sub_swapped`` (eps − ms instead
    of ms + eps, both as a sub), ``off_by_one_fmap`` (the x tile is not walked by the loop).
    """
    prog = rmsnorm_matmul_program(b, k, n)
    kt, nt = k // forloop, n // grid_y
    x_fmap = -1 if mutant == "off_by_one_fmap" else 1
    x_tile = (b, k) if x_fmap == -1 else (b, kt)
    ins = (BlockInput(V("xt", x_tile), 0, (-1, -1, -1), x_fmap),
           BlockInput(V("wt", (kt, nt)), 1, (-1, 1, -1), 0))
    xs = "xt"
    pre: tuple[Node, ...] = ()
    if x_fmap == -1:  # the same slice of x every iteration: a wrong tile, shaped to type-check
        pre = (Node("slice", ("xt",), (V("xs", (b, kt)),), make_attrs(dim=1, start=0, stop=kt)),)
        xs = "xs"
    acc_op = "accum_max" if mutant == "accum_max" else "accum_sum"
    if mutant == "sub_swapped":
        eps_nodes = (Node("const", (), (V("eps", ()),), make_attrs(value=-1e-6, dtype=F32)),
                     Node("sub", ("eps", "ms"), (V("mse", (b, 1)),)))
    else:
        eps_nodes = (Node("const", (), (V("eps", ()),), make_attrs(value=1e-6, dtype=F32)),
                     Node("add", ("ms", "eps"), (V("mse", (b, 1)),)))
    div = float(1 if mutant == "forgot_div_d" else k)
    nodes = pre + (
        Node("matmul", (xs, "wt"), (V("s", (b, nt)),)),
        Node("square", (xs,), (V("sq", (b, kt)),)),
        Node("reduce_sum", ("sq",), (V("r", (b, 1)),), make_attrs(dim=1, keepdim=1)),
        Node(acc_op, ("s",), (V("as", (b, nt)),)),
        Node("accum_sum", ("r",), (V("ar", (b, 1)),)),
        Node("const", (), (V("d", ()),), make_attrs(value=div, dtype=F32)),
        Node("div", ("ar", "d"), (V("ms", (b, 1)),)),
    ) + eps_nodes + (
        Node("rsqrt", ("mse",), (V("rs", (b, 1)),)),
        Node("mul", ("as", "rs"), (V("y", (b, nt)),)),
    )
    omap = (-1, 0, -1) if mutant == "wrong_omap" else (-1, 1, -1)
    out_shape = (b * grid_y, nt) if mutant == "wrong_omap" else (b, n)
    blk = BlockGraph((1, grid_y, 1), 128, forloop, ins, nodes, (BlockOutput("y", omap),), (("sq",),))
    ug = KernelGraph(prog.inputs, (Node("customized", ("x", "w"), (V("out", out_shape),), (), blk),),
                     ("out",), f"rmsnorm_matmul_fused{'_' + mutant if mutant else ''}")
    return check(ug)


def softmax_av_program(m: int, s: int, d: int) -> KernelGraph:
    p = Program("softmax_av")
    x = p.input("s", (m, s))
    v = p.input("v", (s, d))
    p.output(p.matmul(p.softmax(x, dim=-1, stable=True), v))
    return p.build()


SOFTMAX_MUTANTS = ("missing_rescale", "sum_instead_of_max", "no_normalise")


def online_softmax_av(m: int, s: int, d: int, forloop: int, mutant: str | None = None) -> KernelGraph:
    """softmax(s [m, s]) @ v [s, d] in one block: the loop walks the key axis in ``forloop`` chunks.

    Running max m_i (accum_max), o_i = o_{i-1}·exp(m_{i-1} − m_i) + exp(s_i − m_i) @ v_i and the
    same for the row sum l (accum_sum_rescaled); out = o / l. Mutants: ``missing_rescale`` (plain
    accum_sum of the chunk terms: the earlier chunks keep their stale max), ``sum_instead_of_max``
    (the running "max" accumulated with accum_sum), ``no_normalise`` (o without the division by l).
    """
    prog = softmax_av_program(m, s, d)
    st = s // forloop
    ins = (BlockInput(V("x", (m, st)), 0, (-1, -1, -1), 1), BlockInput(V("vt", (st, d)), 1, (-1, -1, -1), 0))
    max_op = "accum_sum" if mutant == "sum_instead_of_max" else "accum_max"
    nodes = [
        Node("reduce_max", ("x",), (V("cm", (m, 1)),), make_attrs(dim=1, keepdim=1)),
        Node(max_op, ("cm",), (V("rm", (m, 1)),)),
    ]
    if mutant == "sum_instead_of_max":  # no running max to read inside the loop: use the chunk max
        shift, rescale = "cm", None
    else:
        shift, rescale = "rm", "rm"
    nodes += [
        Node("sub", ("x", shift), (V("xs", (m, st)),)),
        Node("exp", ("xs",), (V("e", (m, st)),)),
        Node("reduce_sum", ("e",), (V("le", (m, 1)),), make_attrs(dim=1, keepdim=1)),
        Node("matmul", ("e", "vt"), (V("pv", (m, d)),)),
    ]
    if mutant == "missing_rescale" or rescale is None:
        nodes += [Node("accum_sum", ("pv",), (V("o", (m, d)),)), Node("accum_sum", ("le",), (V("l", (m, 1)),))]
    else:
        nodes += [Node("accum_sum_rescaled", ("pv", "rm"), (V("o", (m, d)),)),
                  Node("accum_sum_rescaled", ("le", "rm"), (V("l", (m, 1)),))]
    out = "o"
    if mutant != "no_normalise":
        nodes.append(Node("div", ("o", "l"), (V("y", (m, d)),)))
        out = "y"
    blk = BlockGraph((1, 1, 1), 128, forloop, ins, tuple(nodes), (BlockOutput(out, (-1, -1, -1)),))
    ug = KernelGraph(prog.inputs, (Node("customized", ("s", "v"), (V("out", (m, d)),), (), blk),),
                     ("out",), f"online_softmax_av{'_' + mutant if mutant else ''}")
    return check(ug)
