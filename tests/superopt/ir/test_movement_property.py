"""Random compositions of the data-movement ops round-trip through the text form, evaluate like a
direct numpy transcription (float64, ≤ 1e-12), verify against themselves after text and after
the search's lowering (views, prefix ops), and a moved offset is caught by the verifier."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.movement import random_indices
from superopt.ir import check, from_text, make_attrs, to_text
from superopt.lax import Program
from superopt.search.movement import lower
from superopt.search.movement_search import raise_graph
from superopt.verify import check_equivalent

MOVES = ("slice", "chunk", "concat", "permute", "swap", "repeat", "reshape", "gather", "scatter", "mul")


@st.composite
def movement_programs(draw):
    """(program, numpy reference of every step): a random chain of movement ops over random inputs."""
    p = Program("moves")
    dtype = draw(st.sampled_from(["float32", "bfloat16"]))
    rng_seed = draw(st.integers(0, 2**16))
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=1, max_size=4)))
    x = p.input("x", shape, dtype)
    ops = []  # (handle, numpy fn of the env)
    pool = [(x, lambda env: env["x"])]
    n_idx = 0
    for _ in range(draw(st.integers(1, 8))):
        a, fa = draw(st.sampled_from(pool))
        r = a.type.rank
        kind = draw(st.sampled_from(MOVES))
        d = draw(st.integers(0, r - 1))
        n = a.shape[d]
        if kind == "slice":
            stop = draw(st.integers(1, n))
            start = draw(st.integers(0, stop - 1))
            if (start, stop) == (0, n):
                continue
            v = p.slice(a, d, start, stop)
            f = lambda env, fa=fa, d=d, s=start, e=stop: np.take(fa(env), range(s, e), axis=d)  # noqa: E731
        elif kind == "chunk" and n >= 2:
            parts = p.chunk(a, 2, d)
            k = draw(st.integers(0, len(parts) - 1))
            v = parts[k]
            size = -(-n // 2)
            f = lambda env, fa=fa, d=d, k=k, z=size, n=n: np.take(  # noqa: E731
                fa(env), range(k * z, min(n, (k + 1) * z)), axis=d)
        elif kind == "concat":
            same = [(b, fb) for b, fb in pool if b.type.rank == r and b.dtype == a.dtype and
                    all(b.shape[i] == a.shape[i] for i in range(r) if i != d)]
            b, fb = draw(st.sampled_from(same))
            v = p.concat([a, b], d)
            f = lambda env, fa=fa, fb=fb, d=d: np.concatenate([fa(env), fb(env)], axis=d)  # noqa: E731
        elif kind == "permute":
            perm = draw(st.permutations(range(r)))
            v = p.permute(a, perm) if list(perm) != list(range(r)) else a
            f = lambda env, fa=fa, perm=tuple(perm): np.transpose(fa(env), perm)  # noqa: E731
        elif kind == "swap" and r >= 2:
            e = draw(st.integers(0, r - 1).filter(lambda e: e != d))
            v = p.swap_dims(a, d, e)
            f = lambda env, fa=fa, d=d, e=e: np.swapaxes(fa(env), d, e)  # noqa: E731
        elif kind == "repeat":
            t = draw(st.integers(1, 3))
            v = p.repeat_interleave(a, t, d)
            f = lambda env, fa=fa, d=d, t=t: np.repeat(fa(env), t, axis=d)  # noqa: E731
        elif kind == "reshape":
            v = p.reshape(a, (a.type.numel,))
            f = lambda env, fa=fa: np.reshape(fa(env), -1)  # noqa: E731
        elif kind == "gather":
            m = draw(st.integers(1, 3))
            idx = p.input(f"pos{n_idx}", (m,), "int64")
            n_idx += 1
            v = p.gather(a, idx, d)
            f = lambda env, fa=fa, d=d, i=idx.name: np.take(fa(env), env[i], axis=d)  # noqa: E731
        elif kind == "scatter":
            m = draw(st.integers(1, n))
            src_shape = a.shape[:d] + (m,) + a.shape[d + 1:]
            src = p.input(f"src{n_idx}", src_shape, dtype)
            idx = p.input(f"pos{n_idx}", (m,), "int64")
            n_idx += 1
            v = p.scatter(a, idx, src, d)

            def f(env, fa=fa, d=d, i=idx.name, s=src.name):
                out = np.array(fa(env), dtype=np.float64, copy=True)
                moved = np.moveaxis(out, d, 0)
                moved[env[i]] = np.moveaxis(env[s], d, 0)
                return out
        elif kind == "mul":
            v = p.mul(a, p.neg(a))
            f = lambda env, fa=fa: fa(env) * -fa(env)  # noqa: E731
        else:
            continue
        pool.append((v, f))
        ops.append((v, f))
    if not ops:
        v = p.neg(x)
        ops.append((v, lambda env: -env["x"]))
    outs = ops[-2:] if len(ops) > 1 and ops[-2][0].name != ops[-1][0].name else ops[-1:]
    p.output(*(v for v, _ in outs))
    return p.build(), [f for _, f in outs], rng_seed


def _inputs(g, seed):
    rng = np.random.default_rng(seed)
    dom = NumpyDomain()
    env = {v.name: rng.standard_normal(v.type.shape) for v in g.inputs if v.type.dtype != "int64"}
    env.update(random_indices(g, rng, dom))
    return env


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(movement_programs())
def test_movement_compositions_round_trip_evaluate_and_verify(case):
    g, refs, seed = case
    text = to_text(g)
    back = from_text(text)
    assert back == g and to_text(back) == text
    check(back)
    env = _inputs(g, seed)
    got = evaluate(g, env, NumpyDomain())
    for out, ref in zip(got, refs):
        want = ref(env)
        assert np.shape(out) == np.shape(want)
        assert np.max(np.abs(np.asarray(out) - want), initial=0.0) <= 1e-12
    v = check_equivalent(g, back, trials=3, seed=seed)
    assert v.equivalent, v
    low = lower(g)
    if low.changed and low.core is not g:  # the lowering (views, prefix ops, output views), raised unsearched
        raised = raise_graph(low, low.core)
        v = check_equivalent(g, raised, trials=3, seed=seed)
        assert v.equivalent, (to_text(raised), v)


def test_verifier_catches_a_shifted_slice():
    p = Program("shift")
    x = p.input("x", (5, 9))
    p.output(p.mul(p.slice(x, 1, 2, 6), p.slice(x, 1, 4, 8)))
    g = p.build()
    n = g.nodes[1]
    bad = replace(g, nodes=(g.nodes[0], replace(n, attrs=make_attrs(dim=1, start=3, stop=7))) + g.nodes[2:])
    v = check_equivalent(g, check(bad), trials=2)
    assert not v.equivalent


def test_verifier_catches_a_wrong_scatter_position():
    p = Program("cache")
    c = p.input("cache", (2, 7, 3))
    k = p.input("k", (2, 1, 3))
    pos = p.input("pos", (1,), "int64")
    p.output(p.scatter(c, pos, k, 1))
    g = p.build()
    q = Program("cache")  # writes one position further on (wraps nowhere: a different program)
    c2, k2, pos2 = q.input("cache", (2, 7, 3)), q.input("k", (2, 1, 3)), q.input("pos", (1,), "int64")
    shifted = q.concat([q.slice(c2, 1, 6, 7), q.slice(c2, 1, 0, 6)], 1)
    q.output(q.scatter(shifted, pos2, k2, 1))
    assert not check_equivalent(g, q.build(), trials=4).equivalent
