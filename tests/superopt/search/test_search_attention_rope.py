"""The whole decode-attention site as HF computes it — (q / k RMSNorm) → RoPE → cache write →
GQA attention with the max-subtracted fp32 softmax — matches a float64 numpy reference in the
interpreter, and the search returns a verified design that keeps the max: the step's key rotated by
a small pre kernel, the cache writes as library ops, RoPE on q fused into the attention kernel.
Small odd shapes: 3 kv heads × group 2, head_dim 16, cache lengths 73 / 96."""
from __future__ import annotations

import math

import numpy as np
import pytest

from superopt.interp import NumpyDomain, evaluate
from superopt.ir import to_text
from superopt.lax.attention import decode_layer_attention_program
from superopt.search import SearchBudget, superoptimize
from superopt.verify import check_equivalent
from tests.interpreter import run_interpreted

SMALL = dict(batch=1, q_heads=6, kv_heads=3, head_dim=16)


def _inputs(program, pos: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    env = {v.name: rng.standard_normal(v.type.shape) for v in program.inputs if v.type.dtype != "int64"}
    env["pos"] = np.array([pos], dtype=np.int64)
    return env


def _rms(x, w, eps):
    return w * x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps)


def _rope(x, cos, sin):
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], -1) * sin


def _reference(env, q_heads, kv_heads, softcap=None, qk_norm=False, eps=1e-6):
    """HF's eager decode step in float64: [norm] → RoPE → index_copy_ → repeat_kv → softmax · v."""
    q, k = env["q"], env["k"]
    if qk_norm:
        q, k = _rms(q, env["q_norm_weight"], eps), _rms(k, env["k_norm_weight"], eps)
    q, k = _rope(q, env["cos"], env["sin"]), _rope(k, env["cos"], env["sin"])
    pos = int(env["pos"][0])
    kc, vc = env["k_cache"].copy(), env["v_cache"].copy()
    kc[:, :, pos], vc[:, :, pos] = k[:, :, 0], env["v"][:, :, 0]
    rep = q_heads // kv_heads
    kr, vr = np.repeat(kc, rep, axis=1), np.repeat(vc, rep, axis=1)
    s = q @ np.swapaxes(kr, -1, -2) / np.sqrt(q.shape[-1])
    if softcap is not None:
        s = softcap * np.tanh(s / softcap)
    s = s + env["mask"]
    p = np.exp(s - s.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True) @ vr, kc, vc


def _rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("extra", [dict(kv_len=73), dict(kv_len=96, softcap=50.0), dict(kv_len=73, qk_norm=True)])
def test_program_matches_float64_reference(extra):
    program = decode_layer_attention_program(**SMALL, dtype="float32", **extra)
    for pos in (0, 41, extra["kv_len"] - 1):
        env = _inputs(program, pos, seed=pos)
        got = evaluate(program, env, NumpyDomain())
        want = _reference(env, SMALL["q_heads"], SMALL["kv_heads"], extra.get("softcap"), extra.get("qk_norm", False))
        for g, w in zip(got, want):
            assert _rel(g, w) <= 1e-12


def _exp_reads_a_max(g) -> bool:
    for k in g.customized_nodes():
        by_out = {n.out.name: n for n in k.block.nodes}
        for n in k.block.nodes:
            if n.op == "exp":
                sub = by_out.get(n.args[0])
                if sub is None or sub.op != "sub" or sub.args[1] not in by_out or \
                        by_out[sub.args[1]].op not in ("reduce_max", "accum_max"):
                    return False
    return True


def _attention_kernels(g):
    return [k for k in g.customized_nodes() if "exp" in {n.op for n in k.block.nodes}]


@pytest.mark.parametrize("extra, budget", [
    (dict(kv_len=73), SearchBudget(max_seconds=120, max_states=2_000_000)),
    (dict(kv_len=96, softcap=50.0), SearchBudget(max_seconds=120, max_states=2_000_000)),
])
def test_search_finds_online_softmax_with_rope_and_cache_write(extra, budget):
    program = decode_layer_attention_program(**SMALL, dtype="bfloat16", **extra)
    res = superoptimize(program, budget)
    best = res.best
    assert best is not program, res.stats.verify_notes
    assert any("raised winner" in n and "equivalent" in n for n in res.stats.verify_notes), res.stats.verify_notes
    assert check_equivalent(program, best, trials=3).equivalent
    ops = [n.op for n in best.nodes]
    # the step's key rotated by its own kernel, then the two cache writes, then the attention
    (k_kernel, *attn) = best.customized_nodes()
    assert k_kernel.args[0] == "k" and "exp" not in {n.op for n in k_kernel.block.nodes}
    first_attn = ops.index("customized", ops.index("customized") + 1)
    assert ops.count("scatter") == 2 and max(i for i, o in enumerate(ops) if o == "scatter") < first_attn
    assert 1 <= len(_attention_kernels(best)) <= 2 and _exp_reads_a_max(best)
    assert "concat" in {n.op for n in _attention_kernels(best)[0].block.nodes}  # RoPE on q in the kernel
    env = _inputs(program, pos=extra["kv_len"] - 5)
    for g, w in zip(evaluate(best, env, NumpyDomain()), evaluate(program, env, NumpyDomain())):
        assert _rel(g, w) <= 1e-12


def test_reinstantiate_at_another_cache_length():
    budget = SearchBudget(max_seconds=120, max_states=2_000_000)
    res = superoptimize(decode_layer_attention_program(**SMALL, kv_len=73), budget)
    other = decode_layer_attention_program(**SMALL, kv_len=96)
    again = res.reinstantiate(other)
    assert again.program is other and again.best is not other
    assert 1 <= len(_attention_kernels(again.best)) <= 2 and _exp_reads_a_max(again.best)
    env = _inputs(other, pos=90)
    for g, w in zip(evaluate(again.best, env, NumpyDomain()), evaluate(other, env, NumpyDomain())):
        assert _rel(g, w) <= 1e-12


def test_found_design_runs_in_the_triton_interpreter(tmp_path):
    # the pre kernel, the cache writes and the attention kernel rendered to Triton, run on the CPU
    for dtype in ("float32", "float16"):
        program = decode_layer_attention_program(**SMALL, kv_len=73, dtype=dtype)
        best = superoptimize(program, SearchBudget(max_seconds=120, max_states=2_000_000)).best
        assert best is not program
        (tmp_path / f"{dtype}.program.txt").write_text(to_text(program))
        (tmp_path / f"{dtype}.ugraph.txt").write_text(to_text(best))
    errs = run_interpreted("-m", "tests.superopt.search.attention_interp_run", str(tmp_path))
    for dtype, tol in (("float32", 1e-5), ("float16", 2e-3)):   # docs/conventions.md tolerance table
        assert not isinstance(errs[dtype], str), errs[dtype]
        assert math.isfinite(errs[dtype]) and errs[dtype] <= tol, f"{dtype}: relative error {errs[dtype]:.3e}"
