"""The decode-attention kernels on the GPU: bf16/fp16 against float64, and inside a CUDA graph."""
from __future__ import annotations

import pytest
import torch

from .attention_cases import KERNEL_CASES, kernel_case

TOL = {"bfloat16": 1e-2, "float16": 2e-3}  # docs/conventions.md tolerance table


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", TOL)
@pytest.mark.parametrize("case", KERNEL_CASES)
def test_kernels_match_float64_on_gpu(case, dtype):
    r = kernel_case(*KERNEL_CASES[case], dtype, device="cuda")
    for what in ("out", "key_slot", "value_slot"):
        assert r[what] <= TOL[dtype], f"{case} {dtype} {what}: {r[what]:.3e}"
    assert r["others_untouched"] and r["advanced"], r


@pytest.mark.gpu
def test_graph_replay_reads_the_length_from_the_device():
    from mirage_serve.decode.attention_launch import decode_attention

    torch.manual_seed(0)
    rows, hq, hkv, d, cap = 2, 8, 2, 128, 300
    dev, dt = "cuda", torch.bfloat16
    q, k, v = (torch.randn(rows, h * d, device=dev, dtype=dt) for h in (hq, hkv, hkv))
    cos, sin = torch.ones(rows, d, device=dev, dtype=dt), torch.zeros(rows, d, device=dev, dtype=dt)
    keys = torch.randn(rows, hkv, cap, d, device=dev, dtype=dt)
    values = torch.randn_like(keys)
    counter = torch.tensor(5, device=dev)
    args = (q, k, v, cos, sin, keys, values, counter, None, d ** -0.5)
    decode_attention(*args, advance=counter)  # warm-up (compiles), slot 5
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode_attention(*args, advance=counter)
    for slot in (6, 7, 200):
        counter.fill_(slot)
        graph.replay()
        kk, vv = keys.clone(), values.clone()
        counter.fill_(slot)
        want = decode_attention(*args, advance=counter)
        torch.testing.assert_close(out, want, rtol=0, atol=0)
        assert torch.equal(kk, keys) and torch.equal(vv, values) and int(counter) == slot + 1
