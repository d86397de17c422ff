"""The μGraphs the CUDA codegen tests render: every fixture at its default shape, odd shapes that
take the other code paths (16-byte GEMV rows, batch 3/5), and a split-K matmul whose blocks
reduce into the output (float32 atomics; a workspace and a finishing kernel for half outputs)."""
from __future__ import annotations

from superopt.lax import Program
from tests.fixtures.build import BlockBuilder, Fixture, KernelBuilder, compute_dtype
from tests.fixtures.ugraphs import FIXTURES


def splitk_matmul(rows: int = 3, hidden: int = 256, out: int = 96, split: int = 4, dtype: str = "float32"):
    """x · W with K split across grid axis z (blocks sum with reduce="sum") and walked by the loop."""
    p = Program("splitk_matmul")
    x = p.input("x", (rows, hidden), dtype)
    w = p.input("w", (hidden, out), dtype)
    p.output(p.matmul(x, w))
    prog = p.build()
    k = KernelBuilder(prog, "splitk_matmul")
    cd = compute_dtype(dtype)
    b = BlockBuilder((1, out // 32, split), 2)
    b.load("xt", 0, x.type, (-1, -1, 1), 1, cd)   # [rows, K/(split·2)]
    b.load("wt", 1, w.type, (-1, 1, 0), 0, cd)    # [K/(split·2), 32]
    b.op("s", "matmul", "xt", "wt")
    b.op("acc", "accum_sum", "s")
    y = b.op("acc_out", "cast", "acc", fuse=True, dtype=dtype) if dtype != cd else "acc"
    b.output(y, (-1, 1, -1), reduce="sum")
    (o,) = k.customized(["x", "w"], b, ["out"])
    return Fixture("splitk_matmul", prog, k.build(o), lambda xs: [xs[0] @ xs[1]])

# name -> (fixture builder name, shape kwargs)
ODD_SHAPES = {
    "rmsnorm_matmul_b3_k896_n256": ("rmsnorm_matmul", dict(rows=3, hidden=896, out=256)),
    "llama_qkv_k256_n72": ("llama_qkv", dict(rows=1, hidden=256, out=72)),
    "matmul_residual_b5_k160_n96": ("matmul_residual", dict(rows=5, hidden=160, out=96)),
    "gated_mlp_b3_k128_n64": ("gated_mlp", dict(rows=3, hidden=128, inter=64)),
    "decode_attention_b3_h6_kv2_d64": ("decode_attention", dict(batch=3, q_heads=6, kv_heads=2, head_dim=64,
                                                                kv_len=96)),
}


def all_cases() -> dict[str, tuple[str, dict]]:
    cases = {name: (name, {}) for name in [*FIXTURES, "splitk_matmul"]}
    cases.update(ODD_SHAPES)
    return cases


def build(case: str, dtype: str):
    builder, kwargs = all_cases()[case]
    return {**FIXTURES, "splitk_matmul": splitk_matmul}[builder](dtype=dtype, **kwargs)


def compile_case(key: tuple[str, str]) -> bytes:
    """The sm_90a cubin of one (case, dtype): a process-pool task (NVRTC is single-threaded)."""
    from superopt.codegen.cuda import compile_cuda, render_cuda
    case, dtype = key
    return compile_cuda(render_cuda(build(case, dtype).ugraph))


def compile_all(keys: list[tuple[str, str]], workers: int = 16) -> dict[tuple[str, str], bytes]:
    """Cubins for many cases at once, compiled in fresh (spawned) processes: no CUDA state forks."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(min(workers, len(keys)), mp_context=multiprocessing.get_context("spawn")) as pool:
        return dict(zip(keys, pool.map(compile_case, keys)))
