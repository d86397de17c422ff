"""Time NCCL all-reduce at the sizes a tensor-parallel decode step moves (and large ones, for bandwidth).

A decode step all-reduces ``batch × hidden`` activations twice per layer: 16 KiB at batch 1 on
Llama-3.1-70B, latency-bound, not bandwidth-bound. Both numbers are reported: the time per
all-reduce replayed inside a CUDA graph (as the decode step runs it) and eagerly, and the bus
bandwidth ``2 (n-1)/n × bytes ÷ time`` (NCCL's convention) of the large sizes.
"""
from __future__ import annotations

import statistics

import torch
import torch.distributed as dist

DECODE_SIZES = (4096 * 2, 8192 * 2, 8 * 4096 * 2, 8 * 8192 * 2)  # batch 1 / 8 × hidden 4096 / 8192, bf16
LARGE_SIZES = (1 << 20, 16 << 20, 256 << 20)


def _events_ms(fn, iters: int) -> float:
    """Median ms of ``fn()`` over ``iters`` CUDA-event-timed calls."""
    times = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def allreduce_times(sizes=DECODE_SIZES + LARGE_SIZES, group=None, per_graph: int = 20,
                    graphed: bool = True) -> list[dict]:
    """Per size in bytes (bf16): µs per all-reduce (eager, and replayed from a CUDA graph of
    ``per_graph`` of them) and bus bandwidth in GB/s. Collective: every rank must call it."""
    world = dist.get_world_size(group)
    out = []
    for nbytes in sizes:
        x = torch.randn(nbytes // 2, device="cuda").to(torch.bfloat16)  # never time zeros
        for _ in range(3):
            dist.all_reduce(x, group=group)
        iters = 20 if nbytes > (64 << 20) else 50
        eager_us = _events_ms(lambda: dist.all_reduce(x, group=group), iters) * 1e3
        row = {"bytes": nbytes, "eager_us": eager_us,
               "eager_busbw_GBps": 2 * (world - 1) / world * nbytes / (eager_us * 1e-6) / 1e9}
        if graphed:
            try:
                row.update(_graphed(x, group, per_graph, world))
            except Exception as e:  # reported, never fatal: the eager numbers stand
                row["graph_error"] = f"{type(e).__name__}: {e}"
        out.append(row)
        del x
    return out


def _graphed(x, group, n: int, world: int) -> dict:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # warm-up on the capture stream
        dist.all_reduce(x, group=group)
    torch.cuda.current_stream().wait_stream(stream)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            dist.all_reduce(x, group=group)
    g.replay()
    torch.cuda.synchronize()
    us = _events_ms(g.replay, 10 if x.numel() * 2 > (64 << 20) else 30) * 1e3 / n
    return {"graph_us": us, "graph_busbw_GBps": 2 * (world - 1) / world * x.numel() * 2 / (us * 1e-6) / 1e9}


def graph_capture_probe(group=None) -> dict:
    """Does a CUDA graph capture an all-reduce and give the right sum on replay? (The patched decode
    step relies on it.) Collective."""
    rank = dist.get_rank(group)
    x = torch.empty(4096, device="cuda")
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            dist.all_reduce(x, group=group)
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            dist.all_reduce(x, group=group)
        x.fill_(float(rank + 1))
        g.replay()
        torch.cuda.synchronize()
        world = dist.get_world_size(group)
        want = world * (world + 1) / 2
        ok = bool(torch.all(x == want))
        out = {"ok": ok, "got": float(x[0]), "want": want}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
    out["dtensor_gather"] = _gather_probe(rank)
    return out


def _gather_probe(rank: int) -> dict:
    """HF's column-wise lm_head gathers its logits with a DTensor redistribute (Shard(-1) →
    Replicate); the graphed decode loop captures it. Does that capture and replay right?"""
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor import DTensor, Replicate, Shard

        world = dist.get_world_size()
        mesh = init_device_mesh("cuda", (world,))
        local = torch.empty(2, 8, device="cuda")

        def gather():
            return DTensor.from_local(local, mesh, [Shard(-1)], run_check=False).redistribute(
                placements=[Replicate()]).to_local()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            gather()
        torch.cuda.current_stream().wait_stream(stream)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = gather()
        local.fill_(float(rank + 1))
        g.replay()
        torch.cuda.synchronize()
        want = torch.arange(1, world + 1, device="cuda", dtype=local.dtype).repeat_interleave(8).expand(2, -1)
        return {"ok": bool(torch.equal(out, want))}
    except Exception as e:
        return {"ok": False, "error": f"{type(e).__name__}: {e}"}
