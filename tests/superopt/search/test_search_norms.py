"""Issue 27 (search-ops): superoptimize never raises on a valid program; LayerNorm forms fuse into one
kernel; HF's fp32 upcast stays fp32 in the searched μGraph."""
from __future__ import annotations

from dataclasses import replace

import pytest

from superopt.ir import digest
from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize
from superopt.verify.precision import precision_violations
from tests.fixtures.precision import hf_rmsnorm_matmul_bf16

SMALL = SearchBudget(max_seconds=120, max_states=40_000, grid_dims=1, workers=1)


def test_layernorm_reproduction_returns_the_fallback_with_its_reason():
    p = Program("c")
    x = p.input("x", (4, 16))
    p.output(p.sum(p.sub(x, p.mean(x, -1, keepdim=True)), -1, keepdim=True))
    prog = p.build()
    r = superoptimize(prog)
    assert r.best is not None and r.stats.fallback_reasons
    assert any(digest(g) == digest(prog) for g, _ in r.ranked)


def test_an_op_outside_the_space_is_a_reason_not_an_exception():
    # a reshape between two computed values (at the program's edges it is a view the lowering
    # peels off, search/movement.py, and the rest is searched)
    p = Program("outside")
    x = p.input("x", (3, 8))
    p.output(p.gelu(p.reshape(p.gelu(x), (6, 4))))
    prog = p.build()
    r = superoptimize(prog, SMALL)
    assert digest(r.best) == digest(prog)
    assert any("reshape" in reason for reason in r.stats.fallback_reasons), r.stats.fallback_reasons


def test_a_sum_over_a_size_one_dim_is_searched():
    p = Program("sum1")
    x = p.input("x", (5, 1))
    w = p.input("w", (5, 7))
    p.output(p.mul(p.sum(x, -1, keepdim=True), w))
    r = superoptimize(p.build(), SMALL)
    assert not r.stats.fallback_reasons and r.stats.verified >= 1
    assert min(g.num_kernels for g, _ in r.ranked) == 1


def _ln_program(kind: str, rows=3, hidden=48, out=40):
    p = Program(kind)
    x = p.input("x", (rows, hidden), "float16")
    g = p.input("g", (hidden,), "float16")
    w = p.input("w", (hidden, out), "float16")
    if kind == "ln_matmul":  # no weight, no bias
        p.output(p.matmul(p.layer_norm(x), w))
    elif kind == "ln_wb_matmul":
        b = p.input("b", (hidden,), "float16")
        p.output(p.matmul(p.layer_norm(x, g, b), w))
    elif kind == "ln_matmul_bias_gelu":
        b = p.input("b", (hidden,), "float16")
        bias = p.input("bias", (out,), "float16")
        p.output(p.gelu(p.add(p.matmul(p.layer_norm(x, g, b), w), bias)))
    elif kind == "layernorm1p_matmul":
        p.output(p.matmul(p.layer_norm(x, g, offset=1.0), w))
    elif kind == "gemma_rmsnorm_matmul":  # Gemma: x·rsqrt(mean(x²)+eps)·(1 + w)
        p.output(p.matmul(p.rms_norm(x, p.add(g, p.const(1.0, "float16"))), w))
    return p.build()


@pytest.mark.parametrize("kind", ["ln_matmul", "ln_wb_matmul", "ln_matmul_bias_gelu", "layernorm1p_matmul",
                                  "gemma_rmsnorm_matmul"])
def test_norm_forms_fuse_into_one_verified_kernel(kind):
    r = superoptimize(_ln_program(kind), SMALL)
    assert r.best.num_kernels == 1, r.stats.verify_notes
    assert r.stats.verified >= 1 and "equivalent" in r.stats.verify_notes[0]


def _norm_dtypes(graph) -> set[str]:
    """dtypes of the squares, their sums and the rsqrt in the graph's kernels (not the matmul's sums)."""
    out = set()
    for n in graph.nodes:
        if n.block is None:
            continue
        made = {m.out.name: m for m in n.block.nodes}
        for m in n.block.nodes:
            arg = made.get(m.args[0]) if m.args else None
            if m.op in ("square", "rsqrt") or m.op in ("reduce_sum", "accum_sum") and arg is not None \
                    and (arg.op == "square" or made.get(arg.args[0] if arg.args else "", arg).op == "square"):
                out.add(m.out.type.dtype)
    return out


def test_fp32_upcast_stays_fp32():
    # eps 2^-20 is a bf16 number: a bf16 norm then differs from the program in its dtypes alone, the
    # dtype check's business (with eps 1e-6 the value check sees the bf16 eps, verify.constants)
    prog = hf_rmsnorm_matmul_bf16(eps=2.0**-20)
    kept = superoptimize(prog, replace(SMALL, max_states=300_000))
    assert min(g.num_kernels for g, _ in kept.ranked) == 1 and kept.stats.pruned.get("precision", 0) > 0
    assert _norm_dtypes(kept.best) == {"float32"}
    # every verified candidate, not only the winner, keeps the norm in fp32
    for g, _ in kept.ranked:
        assert "bfloat16" not in _norm_dtypes(g)
    # the ablation: without the rule and the dtype check the search does the norm in bf16 ...
    dropped = superoptimize(prog, replace(SMALL, max_states=300_000, keep_precision=False))
    assert dropped.stats.pruned.get("precision", 0) == 0
    narrow = [g for g, _ in dropped.ranked if "bfloat16" in _norm_dtypes(g)]
    assert narrow, "the rule prunes nothing here"
    # ... and the dtype check rejects every such graph
    assert all(precision_violations(prog, g) for g in narrow)
    assert not precision_violations(prog, kept.best)


def test_the_dtype_check_compares_op_kinds_not_values():
    wide, narrow = hf_rmsnorm_matmul_bf16(), _bf16_rmsnorm()
    got = precision_violations(wide, narrow)
    # sums are one kind with the bf16 matmul, so only the rounding ops are told apart...
    assert {line.split(" in ")[0] for line in got if not line.startswith("constant ")} == {"square", "rsqrt", "div"}, got
    # ... and the constants it declares bf16, which the program holds in fp32 (rule 2, per value)
    assert sorted(line.split(" (")[0] for line in got if line.startswith("constant ")) == [
        "constant 1e-06 in bfloat16", "constant 48 in bfloat16"], got
    assert precision_violations(narrow, wide) == []  # wider than the program is always allowed


def _bf16_rmsnorm(rows=3, hidden=48, out=40):
    p = Program("bf16_rms")
    x = p.input("x", (rows, hidden), "bfloat16")
    g = p.input("g", (hidden,), "bfloat16")
    w = p.input("w", (hidden, out), "bfloat16")
    p.output(p.matmul(p.mul(g, p.rms_norm(x)), w))
    return p.build()


def test_reduced_shapes_recount_a_mean_only_where_its_constant_is_unambiguous():
    from superopt.abstract import analyze
    from superopt.search.verify import _recounted, _resized, count_consts
    from superopt.search.instantiate import reshape_program

    p = Program("two_means")
    a, b = p.input("a", (3, 16)), p.input("b", (16, 16))
    p.output(p.add(p.mean(a, -1, True), p.mean(b, 0, True)))  # two indices of extent 16
    prog = p.build()
    index = analyze(prog)
    counts = count_consts(prog, index)
    assert len(counts) == 2 and len(set(counts.values())) == 2
    ia, ib = counts.values()
    for cut, recounted in (({ia: 5, ib: 5}, True), ({ia: 5, ib: 6}, False)):
        sizes = {**{i: 3 for i in index.sizes}, **cut}
        small, idx = _recounted(reshape_program(prog, index, sizes), _resized(index, sizes), counts)
        values = {float(n.attr("value")) for n in small.nodes if n.op == "const"}
        assert values == ({5.0} if recounted else {16.0}), (sizes, values)
