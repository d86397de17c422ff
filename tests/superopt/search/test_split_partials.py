"""Partial sums across blocks are carried at the accumulation precision (``search.precision.widen_partials``).

A split kernel (flash decoding's KV splits, split-K) writes one part of a sum per block; the
combine kernel finishes it. In a bf16 / fp16 program the search used to store those parts in the
program's dtype: the total was rounded before the combine divided by it. (The backends add the
parts in float32 either way — Triton's workspaces, torch's sum — so the error does not grow with
the splits; ``benchmarks/results/split_partials_cpu_2026-11-26.md``.) Qwen2.5-0.5B at one row is
fastest with 128 KV splits, so these tests use that shape; the before-design is rebuilt by
``tests.fixtures.precision.narrow_partials`` and must be less accurate on the same inputs.
"""
from __future__ import annotations


import numpy as np
import pytest
import torch

from superopt.interp import NumpyDomain, evaluate
from superopt.interp.torch_domain import TorchDomain
from superopt.ir import check, to_text
from superopt.search import SearchBudget, superoptimize
from tests.fixtures.precision import narrow_partials
from tests.fixtures.ugraphs import FIXTURES
from tests.interpreter import run_interpreted

SPLITS = 128
QWEN_B1 = dict(batch=1, q_heads=14, kv_heads=2, head_dim=64, kv_len=4096)
TOL = {"bfloat16": 1e-2, "float16": 2e-3}  # CONVENTIONS.md
SCALE = 0.2  # bench_blocks.make_inputs: attention without a max overflows fp16 on unit-normal scores


def _search(dtype: str):
    fx = FIXTURES["decode_attention"](dtype=dtype, **QWEN_B1)
    return fx, superoptimize(fx.program, SearchBudget(max_seconds=30)).candidates()


def _splits(g) -> int:
    """KV splits of a two-kernel design: its split kernel's blocks summed into one partial tile."""
    nodes = g.customized_nodes()
    if len(nodes) != 2:
        return 0
    b = nodes[0].block
    o = next((o for o in b.outputs if o.reduce == "sum"), None)
    return 0 if o is None else max(b.grid[a] for a in range(3) if o.omap[a] == -1)


def _split_design(cands):
    found = [g for g in cands if _splits(g) == SPLITS]
    assert found, sorted({_splits(g) for g in cands})
    return found[0]


@pytest.fixture(scope="module")
def bf16():
    return _search("bfloat16")


def test_every_split_design_stores_its_partials_in_float32(bf16):
    fx, cands = bf16
    split = [g for g in cands if any(o.reduce == "sum" for n in g.customized_nodes() for o in n.block.outputs)]
    assert split, "no split design among the candidates"
    for g in split:
        first, combine = g.customized_nodes()
        for v, o in zip(first.outs, first.block.outputs):
            if o.reduce == "sum":
                assert v.type.dtype == "float32", (v, to_text(g))
        # the combine computes on the wide sums and rounds once, to the program's output dtype
        assert {n.out.type.dtype for n in combine.block.nodes if n.op != "cast"} == {"float32"}, to_text(g)
        assert {v.type.dtype for v in combine.outs} == {"bfloat16"}
    assert all(g.output_types == fx.program.output_types for g in cands)


def _inputs(program, dtype: str, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [(torch.randn(v.type.shape, generator=gen, dtype=torch.float64) * SCALE).to(getattr(torch, dtype))
            for v in program.inputs]


def _rel(out: torch.Tensor, ref: np.ndarray) -> float:
    return float(np.linalg.norm(out.double().numpy() - ref) / np.linalg.norm(ref))


def test_128_kv_splits_in_bf16_are_within_tolerance_on_the_torch_backend(bf16):
    # the CPU backend of patch() (interp.torch_domain) runs the design in the dtypes it declares
    fx, cands = bf16
    wide = _split_design(cands)
    narrow = check(narrow_partials(wide))
    xs = _inputs(fx.program, "bfloat16")
    ref = evaluate(fx.program, [x.double().numpy() for x in xs], NumpyDomain())[0]
    err_wide = _rel(evaluate(wide, xs, TorchDomain())[0], ref)
    err_narrow = _rel(evaluate(narrow, xs, TorchDomain())[0], ref)
    print(f"bf16 {SPLITS} splits, torch backend: fp32 partials {err_wide:.3e}, bf16 partials {err_narrow:.3e}")
    assert err_wide <= TOL["bfloat16"]
    assert err_wide < err_narrow


def test_128_kv_splits_in_fp16_are_within_tolerance_in_the_triton_interpreter(tmp_path):
    # the Triton render (fp32 workspaces for cross-block sums, ``codegen.triton``) in its CPU
    # interpreter; fp16, as the interpreter runs no bf16 dot (numpy has no bf16: it returned zeros)
    fx, cands = _search("float16")
    wide = _split_design(cands)
    for name, g in {"wide": wide, "narrow": check(narrow_partials(wide))}.items():
        (tmp_path / f"{name}.program.txt").write_text(to_text(fx.program))
        (tmp_path / f"{name}.ugraph.txt").write_text(to_text(g))
    errs = run_interpreted("-m", "tests.superopt.search.attention_interp_run", str(tmp_path), str(SCALE))
    print(f"fp16 {SPLITS} splits, Triton interpreter: fp32 partials {errs['wide']}, fp16 partials {errs['narrow']}")
    assert not isinstance(errs["wide"], str), errs["wide"]
    assert errs["wide"] <= TOL["float16"]
    assert not isinstance(errs["narrow"], str), errs["narrow"]
    assert errs["wide"] < errs["narrow"]
