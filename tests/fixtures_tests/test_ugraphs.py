"""The hand-written fused μGraph fixtures: valid, equal to their numpy references, mutants differ."""
from __future__ import annotations

import numpy as np
import pytest

from superopt.interp import NumpyDomain, evaluate
from superopt.ir import SMEM_BUDGET, check, from_text, shared_memory_bytes, to_text
from tests.fixtures.build import near_sqrt_divisor, splits
from tests.fixtures.ugraphs import FIXTURES, mutants, random_inputs

TOL = 1e-12  # float64 interpreter vs float64 numpy (Must-show 3)
ATTENTION = {"gqa", "qknorm", "decode_attention"}
KINDS = {"wrong_accumulator", "missing_scale", "swapped_operands", "off_by_one_tile", "wrong_imap",
         "max_without_rescale"}

# Non-power-of-two shapes: Qwen2.5-0.5B-like hidden 896 scaled to 112/224, head dim 64, batch 3,
# a prime width (73) that leaves one column per block.
ODD = {
    "rmsnorm_matmul": dict(rows=3, hidden=224, out=73),
    "llama_qkv": dict(rows=3, hidden=112, out=144),
    "gated_mlp": dict(rows=3, hidden=112, inter=152),
    "rmsnorm_gated_mlp": dict(rows=3, hidden=224, inter=152),
    "lora": dict(rows=3, hidden=112, out=73, rank=5),
    "ntrans": dict(rows=24, hidden=112),
    "matmul_residual": dict(rows=3, hidden=152, out=112),
    "gqa": dict(batch=3, q_len=12, head_dim=64, kv_len=200),
    "qknorm": dict(batch=3, q_len=7, head_dim=64, kv_len=200),
    "decode_attention": dict(batch=3, q_heads=14, kv_heads=2, head_dim=64, kv_len=200),
}
# Degenerate tilings: one block, one loop iteration, single rows/heads (mutants that would be no bug
# there must be left out, the rest must still number three).
TINY = {
    "rmsnorm_matmul": dict(rows=1, hidden=8, out=2), "llama_qkv": dict(rows=1, hidden=8, out=2),
    "gated_mlp": dict(rows=1, hidden=8, inter=2), "rmsnorm_gated_mlp": dict(rows=1, hidden=8, inter=2),
    "lora": dict(rows=1, hidden=8, out=2, rank=1), "ntrans": dict(rows=1, hidden=8),
    "matmul_residual": dict(rows=1, hidden=8, out=2),
    "gqa": dict(batch=1, q_len=1, head_dim=8, kv_len=32),
    "qknorm": dict(batch=1, q_len=1, head_dim=8, kv_len=32),
    "decode_attention": dict(batch=1, q_heads=3, kv_heads=1, head_dim=8, kv_len=32),
}
# The paper's and Llama-3-8B's shapes (BENCHMARKS.md §1–2): checked (tiling, smem), not evaluated.
REAL = {
    "rmsnorm_matmul": dict(rows=16, hidden=4096, out=6144, dtype="float16"),
    "llama_qkv": dict(rows=8, hidden=4096, out=6144, dtype="bfloat16"),
    "gated_mlp": dict(rows=8, hidden=4096, inter=4096, dtype="float16"),
    "rmsnorm_gated_mlp": dict(rows=16, hidden=4096, inter=14336, dtype="bfloat16"),
    "lora": dict(rows=16, hidden=256, out=4096, rank=16, dtype="float16"),
    "ntrans": dict(rows=64, hidden=4096, dtype="float16"),
    "matmul_residual": dict(rows=16, hidden=14336, out=4096, dtype="bfloat16"),
    "gqa": dict(batch=8, q_len=256, head_dim=64, kv_len=4096, dtype="float16"),
    "qknorm": dict(batch=8, q_len=256, head_dim=64, kv_len=4096, dtype="float16"),
    "decode_attention": dict(batch=16, q_heads=32, kv_heads=8, head_dim=128, kv_len=32768, dtype="bfloat16"),
}
SHAPES = {"default": {n: {} for n in FIXTURES}, "odd": ODD, "tiny": TINY}
CASES = [(n, shapes[n]) for shapes in SHAPES.values() for n in FIXTURES]
IDS = [f"{n}-{kind}" for kind in SHAPES for n in FIXTURES]


def rel(a, b) -> float:
    return float(np.linalg.norm(np.asarray(a) - b) / np.linalg.norm(b))


def test_every_fixture_has_odd_and_real_shapes():
    assert set(ODD) == set(FIXTURES) == set(REAL) == set(TINY)


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_fused_and_program_match_reference(name, kw):
    fx = FIXTURES[name](**kw)
    assert fx.name == name
    check(fx.ugraph)
    check(fx.program)
    assert fx.ugraph.inputs == fx.program.inputs
    assert fx.ugraph.output_types == fx.program.output_types
    assert fx.ugraph.num_kernels == (2 if name in ATTENTION else 1)
    xs = random_inputs(fx, np.random.default_rng(7))
    assert all(x.dtype == np.float64 and np.all(x != 0) for x in xs)
    (ref,) = fx.reference(xs)
    (got,) = evaluate(fx.ugraph, xs, NumpyDomain())
    (prog,) = evaluate(fx.program, xs, NumpyDomain())
    assert got.shape == ref.shape == fx.program.output_types[0].shape
    assert rel(got, ref) < TOL
    assert rel(prog, ref) < TOL


@pytest.mark.parametrize("name,kw", CASES, ids=IDS)
def test_every_mutant_is_valid_and_wrong(name, kw):
    fx = FIXTURES[name](**kw)
    ms = mutants(fx)
    labels = [label for label, _ in ms]
    assert len(ms) >= 3 and len(set(labels)) == len(labels)
    assert {label.split(":")[0] for label in labels} <= KINDS
    xs = random_inputs(fx, np.random.default_rng(11))
    (ref,) = fx.reference(xs)
    for label, g in ms:
        check(g)  # a semantic bug, not a shape error
        assert g.inputs == fx.ugraph.inputs and g.output_types == fx.ugraph.output_types, label
        (got,) = evaluate(g, xs, NumpyDomain())
        assert rel(got, ref) > 1e-3, f"{name} mutant {label} computes the reference"


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_text_round_trip(name):
    fx = FIXTURES[name]()
    for g in [fx.ugraph, fx.program] + [m for _, m in mutants(fx)]:
        assert from_text(to_text(g)) == g


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_real_shapes_fit_sm90(name):
    dtype = REAL[name]["dtype"]
    fx = FIXTURES[name](**REAL[name])
    check(fx.ugraph, arch="sm_90")
    assert all(v.type.dtype == dtype for v in fx.ugraph.inputs)
    assert all(t.dtype == dtype for t in fx.ugraph.output_types)
    for n in fx.ugraph.customized_nodes():
        assert shared_memory_bytes(n.block) <= SMEM_BUDGET["sm_90"]
        # half-precision tiles are cast to float32 before any arithmetic (accumulation in fp32)
        assert all(x.out.type.dtype == "float32" for x in n.block.nodes if x.op.startswith("accum"))


# Evaluated at full size: the paper suite at b=1 (BENCHMARKS.md §1) and the Qwen2.5-0.5B decode blocks
# (hidden 896, 14 q / 2 kv heads of dim 64, intermediate 4864, qkv width 896 + 2·128).
FULL = [
    ("rmsnorm_matmul", dict(rows=2, hidden=4096, out=6144)),
    ("gated_mlp", dict(rows=8, hidden=4096, inter=4096)),
    ("lora", dict(rows=16, hidden=256, out=4096, rank=16)),
    ("ntrans", dict(rows=8, hidden=4096)),
    ("gqa", dict(batch=1, q_len=256, head_dim=64, kv_len=4096)),
    ("qknorm", dict(batch=1, q_len=256, head_dim=64, kv_len=4096)),
    ("llama_qkv", dict(rows=1, hidden=896, out=1152)),
    ("rmsnorm_gated_mlp", dict(rows=1, hidden=896, inter=4864)),
    ("matmul_residual", dict(rows=1, hidden=4864, out=896)),
    ("decode_attention", dict(batch=1, q_heads=14, kv_heads=2, head_dim=64, kv_len=512)),
]


@pytest.mark.parametrize("name,kw", FULL, ids=[n for n, _ in FULL])
def test_full_shapes_match_reference(name, kw):
    fx = FIXTURES[name](**kw)
    xs = random_inputs(fx, np.random.default_rng(3))
    (got,) = evaluate(fx.ugraph, xs, NumpyDomain())
    assert rel(got, fx.reference(xs)[0]) < TOL


def test_split_helpers():
    assert splits(96, 32) == 3 and splits(80, 32) == 4 and splits(73, 32) == 73 and splits(8, 32) == 1
    assert near_sqrt_divisor(4) == 2 and near_sqrt_divisor(8) == 2 and near_sqrt_divisor(7) == 1


# CONVENTIONS.md tolerance table: the fused graph run in the tensors' dtype by the torch Domain,
# against the float64 reference on the same (rounded) inputs.
TORCH_TOL = {"float32": 1e-5, "float16": 2e-3, "bfloat16": 1e-2}


@pytest.mark.parametrize("dtype", sorted(TORCH_TOL))
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_torch_domain_in_model_dtype(name, dtype):
    torch = pytest.importorskip("torch")
    from superopt.interp.torch_domain import TORCH_DTYPES, TorchDomain
    fx = FIXTURES[name](dtype=dtype, **ODD[name])
    xs = [torch.tensor(x).to(TORCH_DTYPES[dtype]) for x in random_inputs(fx, np.random.default_rng(5))]
    (ref,) = fx.reference([x.double().numpy() for x in xs])
    (got,) = evaluate(fx.ugraph, xs, TorchDomain())
    assert got.dtype == TORCH_DTYPES[dtype]
    assert rel(got.double().numpy(), ref) < TORCH_TOL[dtype]
    for label, g in mutants(fx):  # mutants stay check()-valid in every dtype
        assert g.output_types == fx.ugraph.output_types, label


# Split-K RMSNorm GEMVs (grid z cuts K, the parts summed across blocks, the rms over the whole rows
# walked by the same loop): odd widths, one loop iteration, the paper's b1 shape.
SPLIT_K = [
    ("rmsnorm_matmul", dict(rows=3, hidden=224, out=73, split_k=2)),
    ("llama_qkv", dict(rows=3, hidden=112, out=144, split_k=4)),
    ("llama_qkv", dict(rows=1, hidden=96, out=40, split_k=3)),
    ("rmsnorm_matmul", dict(rows=2, hidden=4096, out=6144, split_k=4)),
]


@pytest.mark.parametrize("name,kw", SPLIT_K, ids=[f"{n}-k{kw['hidden']}-s{kw['split_k']}" for n, kw in SPLIT_K])
def test_split_k_rmsnorm_matches_reference_and_mutants_differ(name, kw):
    fx = FIXTURES[name](**kw)
    (blk,) = [n.block for n in fx.ugraph.customized_nodes()]
    assert blk.grid[2] == kw["split_k"] and blk.outputs[0].reduce == "sum"
    xs = random_inputs(fx, np.random.default_rng(13))
    (ref,) = fx.reference(xs)
    assert rel(evaluate(fx.ugraph, xs, NumpyDomain())[0], ref) < TOL
    for label, g in mutants(fx):
        assert rel(evaluate(g, xs, NumpyDomain())[0], ref) > 1e-3, f"{name} mutant {label} computes the reference"


def test_split_k_rmsnorm_fits_sm90_at_llama_qkv_b8():
    fx = FIXTURES["llama_qkv"](rows=8, hidden=4096, out=6144, dtype="bfloat16", split_k=4)
    check(fx.ugraph, arch="sm_90")
    assert shared_memory_bytes(fx.ugraph.customized_nodes()[0].block) <= SMEM_BUDGET["sm_90"]


@pytest.mark.parametrize("split_k", [0, 5])
def test_split_k_must_divide_hidden(split_k):
    with pytest.raises(ValueError, match=f"split_k={split_k} must be a positive divisor of hidden=96"):
        FIXTURES["rmsnorm_matmul"](hidden=96, split_k=split_k)
