"""Canonical text form: ``from_text(to_text(g)) == g`` on random programs and fused block graphs;
the digest is stable (across processes and releases) and sensitive to every detail."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from superopt.ir import check, digest, from_text, to_text
from superopt.lax import Program

from tests.fixtures.graphs import online_softmax_av, rmsnorm_matmul

UNARY = ("exp", "neg", "square", "sqrt", "rsqrt", "silu", "gelu_tanh", "sigmoid", "tanh")
BINARY = ("add", "sub", "mul", "div")
DTYPES = ("float32", "float16", "bfloat16", "float64")
FLOATS = st.one_of(st.floats(allow_nan=False, width=64), st.sampled_from([1e-6, -0.0, 0.1, 1 / 3, 4096.0]))


@st.composite
def programs(draw):
    """A random valid Lax program: random inputs, then a random sequence of ops on earlier values."""
    p = Program(draw(st.sampled_from(["prog", "rms_norm.v2", "x"])))
    dtype = draw(st.sampled_from(DTYPES))
    pool = []
    for i in range(draw(st.integers(1, 3))):
        shape = draw(st.lists(st.integers(1, 7), min_size=1, max_size=3))
        pool.append(p.input(f"in{i}", shape, dtype))
    for _ in range(draw(st.integers(1, 12))):
        a = draw(st.sampled_from(pool))
        kind = draw(st.sampled_from(["unary", "binary", "const", "reduce", "transpose", "reshape",
                                     "cast", "slice", "concat", "matmul"]))
        if a.type.rank == 0 and kind in ("reduce", "slice", "concat"):
            continue
        if kind == "unary":
            v = getattr(p, draw(st.sampled_from(UNARY)))(a)
        elif kind == "binary":
            same = [b for b in pool if b.shape == a.shape and b.dtype == a.dtype]
            v = getattr(p, draw(st.sampled_from(BINARY)))(a, draw(st.sampled_from(same)))
        elif kind == "const":
            v = p.mul(a, p.const(draw(FLOATS), a.dtype))
        elif kind == "reduce":
            dim = draw(st.integers(-a.type.rank, a.type.rank - 1))
            v = getattr(p, draw(st.sampled_from(["sum", "max"])))(a, dim, keepdim=draw(st.booleans()))
        elif kind == "transpose" and a.type.rank >= 2:
            v = p.transpose(a)
        elif kind == "reshape":
            v = p.reshape(a, (a.type.numel,))
        elif kind == "cast":
            v = p.cast(a, draw(st.sampled_from(DTYPES)))
        elif kind == "slice":
            dim = draw(st.integers(0, a.type.rank - 1))
            stop = draw(st.integers(1, a.shape[dim]))
            v = p.slice(a, dim, draw(st.integers(0, stop - 1)), stop)
        elif kind == "concat":
            v = p.concat([a, a], dim=draw(st.integers(0, a.type.rank - 1)))
        elif kind == "matmul" and a.type.rank >= 2:
            v = p.matmul(a, p.transpose(a))
        else:
            continue
        pool.append(v)
    p.output(*draw(st.lists(st.sampled_from(pool), min_size=1, max_size=2)))
    return p.build()


@settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs())
def test_round_trip_programs(g):
    text = to_text(g)
    back = from_text(text)
    assert back == g
    assert to_text(back) == text and digest(back) == digest(g)
    check(back)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@st.composite
def fused_graphs(draw):
    """Fused block graphs at random legal shapes, with and without mutants and thread groups."""
    if draw(st.booleans()):
        b, kt, nt = draw(st.integers(1, 5)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
        gy, fl = draw(st.integers(1, 6)), draw(st.integers(1, 6))
        mutant = draw(st.sampled_from([None, "forgot_div_d", "accum_max", "sub_swapped"]))
        g = rmsnorm_matmul(b, kt * fl, nt * gy, gy, fl, mutant)
    else:
        m, s, d = draw(st.integers(1, 4)), draw(st.integers(1, 12)), draw(st.integers(1, 5))
        fl = draw(st.sampled_from(_divisors(s)))
        mutant = draw(st.sampled_from([None, "missing_rescale", "sum_instead_of_max", "no_normalise"]))
        g = online_softmax_av(m, s, d, fl, mutant)
    node = g.nodes[0]
    blk = node.block
    groups = draw(st.lists(st.sampled_from([n.out.name for n in blk.nodes if n.op in UNARY + BINARY]),
                           max_size=3, unique=True))
    blk = replace(blk, thread_groups=(tuple(groups),) if groups else (),
                  block_threads=draw(st.sampled_from([32, 128, 256, 1024])))
    return replace(g, nodes=(replace(node, block=blk),), _types=None)


@settings(max_examples=80, deadline=None, database=None)
@given(fused_graphs())
def test_round_trip_fused(g):
    check(g)
    assert from_text(to_text(g)) == g


GOLDEN_DIGEST = "60a069f705d82ad5"  # rmsnorm_matmul(3, 96, 80, 4, 3): a cache key; change = cache break


def test_digest_is_stable_across_processes_and_releases():
    g = rmsnorm_matmul(3, 96, 80, 4, 3)
    code = ("from tests.fixtures.graphs import rmsnorm_matmul; from superopt.ir import digest; "
            "print(digest(rmsnorm_matmul(3, 96, 80, 4, 3)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", "PATH": ""}, cwd=Path(__file__).resolve().parents[3])
    assert out.stdout.strip() == digest(g) == GOLDEN_DIGEST


@pytest.mark.parametrize("edit", ["grid", "omap", "const", "dtype", "fuse"])
def test_digest_changes_with_every_detail(edit):
    g = rmsnorm_matmul(3, 96, 80, 4, 3)
    node = g.nodes[0]
    blk = node.block
    if edit == "grid":
        blk = replace(blk, forloop=2)
    elif edit == "omap":
        blk = replace(blk, outputs=(replace(blk.outputs[0], reduce="sum"),))
    elif edit == "const":
        blk = replace(blk, nodes=tuple(replace(n, attrs=(("dtype", "float32"), ("value", 1e-5)))
                                       if n.out.name == "eps" else n for n in blk.nodes))
    elif edit == "fuse":
        blk = replace(blk, thread_groups=())
    g2 = replace(g, nodes=(replace(node, block=blk),), _types=None)
    if edit == "dtype":
        g2 = from_text(to_text(g).replace("input %w : float32", "input %w : float16"))
    assert digest(g2) != digest(g)
