"""GPU timing that can be trusted: CUDA events, medians, inputs rotated beyond L2, graph replay.

``time_call`` captures one call per rotating input set into a CUDA graph (when ``graph``), so
launch overhead is paid once per replay as in a captured decode step, then reports the median
over replays of (replay time ÷ sets). Without ``graph`` it times each eager call with events.
"""
from __future__ import annotations

import statistics
from typing import Callable, Sequence

import torch


def l2_bytes(device=None) -> int:
    props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", 50 * 2**20))


def rotated_sets(inputs: Sequence[torch.Tensor], min_bytes: int | None = None, max_sets: int = 32
                 ) -> list[list[torch.Tensor]]:
    """Copies of ``inputs`` (fresh addresses) whose total exceeds ``min_bytes`` (default 2×L2)."""
    per_set = sum(t.numel() * t.element_size() for t in inputs) or 1
    want = min_bytes if min_bytes is not None else 2 * l2_bytes()
    n = max(2, min(max_sets, -(-want // per_set)))
    return [list(inputs)] + [[t.clone() for t in inputs] for _ in range(n - 1)]


def time_call(fn: Callable, sets: Sequence[Sequence[torch.Tensor]], graph: bool = True, reps: int = 30,
              warmup: int = 3, give_up_us: float = float("inf")) -> float:
    """Median microseconds of one ``fn(*set)``; after the warm-up, a first timed rep above
    ``give_up_us`` is returned alone (a candidate already known to lose needs no median)."""
    for _ in range(warmup):
        for s in sets:
            fn(*s)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    if graph:
        g = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            with torch.cuda.graph(g, stream=stream):
                for s in sets:
                    fn(*s)
        torch.cuda.current_stream().wait_stream(stream)
        g.replay()
        torch.cuda.synchronize()
        for _ in range(reps):
            start.record()
            g.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3 / len(sets))
            if times[0] > give_up_us:
                break
    else:
        for r in range(reps):
            s = sets[r % len(sets)]
            start.record()
            fn(*s)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
            if times[0] > give_up_us:
                break
    return statistics.median(times)


def context_alive(device) -> bool:
    """Whether this process can still run work on ``device``: after a sticky CUDA error (an illegal
    address) every call fails, so nothing timed after it means anything."""
    try:
        (torch.ones(1, device=device) + 1).item()
        return True
    except Exception:
        return False


def copy_bandwidth(nbytes: int = 1 << 30, device="cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (the
    bandwidth floor every benchmark divides by; one definition for all of them)."""
    with torch.cuda.device(device):
        a = torch.empty(nbytes // 2, dtype=torch.uint8, device=device).random_()  # never time zeros
        b = torch.empty_like(a)
        us = time_call(lambda x, y: y.copy_(x), [[a, b]], graph=False, reps=20)
    return 2 * a.numel() / (us * 1e-6)


def same_size_copy_us(nbytes: int) -> float:
    """µs of a device-to-device copy that moves ``nbytes`` (half read, half written), timed as
    ``time_call`` times a kernel: graph-replayed over buffers rotated beyond L2. At a decode block's
    few MB a launch's fixed costs (the first bytes' latency, the last wave) are a large share, so
    this, not the 1 GiB ``copy_bandwidth``, is what a kernel of that size can reach."""
    half = torch.empty(max(1, nbytes // 2), dtype=torch.uint8, device="cuda").random_()
    return time_call(lambda a, b: b.copy_(a), rotated_sets([half, torch.empty_like(half)]), graph=True)
