"""The search on programs with data movement: Phi-3's fused qkv_proj + split and gate_up_proj +
chunk + silu·mul become one kernel (views, never copies), a GQA head repeat is a block-input
view, RoPE's rotate_half fuses, a cache write runs before the kernel; all verified, at odd shapes."""
from __future__ import annotations

import numpy as np
import pytest

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.movement import random_indices
from superopt.lax import Program
from superopt.search import SearchBudget, superoptimize
from superopt.search.movement import lower
from superopt.verify import check_equivalent
from tests.fixtures import movement as mv

BUDGET = SearchBudget(max_seconds=60)


def _float64_error(program, graph, seed=0):
    rng = np.random.default_rng(seed)
    env = {v.name: rng.standard_normal(v.type.shape) for v in program.inputs if v.type.dtype != "int64"}
    env.update(random_indices(program, rng, NumpyDomain()))
    worst = 0.0
    for a, b in zip(evaluate(program, env, NumpyDomain()), evaluate(graph, env, NumpyDomain())):
        worst = max(worst, float(np.linalg.norm(np.asarray(b) - a) / np.linalg.norm(a)))
    return worst


def _inputs_views(g):
    return [(n.args[i.source], i.view) for n in g.customized_nodes() for i in n.block.inputs if i.view]


def test_lowering_of_phi3_programs():
    low = lower(mv.phi3_mlp(m=1, d=73, inter=48))
    assert sorted(low.views.values()) == [("gate_up_w", (("slice", 0, 0, 48),)),
                                          ("gate_up_w", (("slice", 0, 48, 96),))]
    assert "slice" not in {n.op for n in low.core.nodes}
    low = lower(mv.phi3_qkv(m=1, d=73))
    assert [n.op for n in low.suffix] == ["slice"] * 3 and low.core.outputs != low.program.outputs


def test_repeat_kv_written_as_expand_is_one_view():
    p = Program("repeat_kv")
    k = p.input("k", (2, 3, 5, 4))
    q = p.input("q", (2, 9, 5, 4))
    e = p.repeat_interleave(p.reshape(k, (2, 3, 1, 5, 4)), 3, 2)
    p.output(p.mul(p.reshape(e, (2, 9, 5, 4)), q))
    low = lower(p.build())
    assert list(low.views.values()) == [("k", (("repeat", 1, 3),))]


@pytest.mark.parametrize("build, args", [(mv.phi3_qkv, dict(m=1, d=73, heads=3, kv=1, hd=8)),
                                         (mv.phi3_qkv, dict(m=5, d=96)),
                                         (mv.phi3_mlp, dict(m=1, d=73, inter=48)),
                                         (mv.phi3_mlp, dict(m=3, d=96, inter=37))])
def test_phi3_fused_projection_is_one_kernel(build, args):
    program = build(**args)
    res = superoptimize(program, BUDGET)
    best = res.best
    assert best.num_kernels == 1 and len(best.customized_nodes()) == 1
    assert any("raised winner" in n and "equivalent" in n for n in res.stats.verify_notes), res.stats.verify_notes
    assert _float64_error(program, best) <= 1e-12
    assert check_equivalent(program, best, trials=3).equivalent
    if build is mv.phi3_mlp:  # the chunk halves: two reads of the one weight at row offsets
        inter = args["inter"]
        assert sorted(v for _, v in _inputs_views(best)) == [(("slice", 0, 0, inter),),
                                                             (("slice", 0, inter, 2 * inter),)]
    else:  # q, k, v: views of the kernel's single output
        assert [n.op for n in best.nodes[1:]] == ["slice"] * 3


def test_gqa_head_repeat_is_a_view():
    program = mv.gqa_scale(kv=3, rep=4, s=5, hd=8)
    best = superoptimize(program, BUDGET).best
    assert best.num_kernels == 1
    assert _inputs_views(best) == [("k", (("repeat", 0, 4),))]
    assert _float64_error(program, best) <= 1e-12


def test_rope_rotate_half_fuses():
    program = mv.rope(heads=3, hd=10, table=17)
    best = superoptimize(program, BUDGET).best
    (kernel,) = best.customized_nodes()
    assert "concat" in {n.op for n in kernel.block.nodes}  # rotate_half inside the block
    assert [n.op for n in best.nodes if n.block is None] == ["gather", "gather"]  # cos / sin at the position
    assert _float64_error(program, best) <= 1e-12
    assert check_equivalent(program, best, trials=3).equivalent


def test_cache_write_runs_before_the_kernel():
    program = mv.cache_write(kv=2, length=11, hd=6)
    res = superoptimize(program, BUDGET)
    raised = [g for g, _ in res.ranked if g.customized_nodes()]
    assert raised and all(g.nodes[0].op == "scatter" for g in raised)
    for g in raised + [res.best]:
        assert _float64_error(program, g) <= 1e-12


def test_reinstantiate_at_another_shape():
    res = superoptimize(mv.phi3_mlp(m=1, d=73, inter=48), BUDGET)
    other = mv.phi3_mlp(m=4, d=73, inter=48)
    again = res.reinstantiate(other)
    assert again.best.num_kernels == 1 and again.program is other
    assert _float64_error(other, again.best) <= 1e-12


def test_rope_on_heads_viewed_from_a_projection_output():
    # q arrives flat [1, H·hd] (a projection's output) and is viewed as heads: a prefix view, no launch
    p = Program("rope_heads")
    q = p.input("q", (1, 4 * 16))
    cos, sin = p.input("cos", (1, 16)), p.input("sin", (1, 16))
    p.output(p.rope(p.reshape(q, (4, 1, 16)), cos, sin))
    program = p.build()
    best = superoptimize(program, BUDGET).best
    assert best.num_kernels == 1 and [n.op for n in best.nodes][0] == "reshape"
    assert _float64_error(program, best) <= 1e-12
