"""One decode step of a model, captured in a CUDA graph and replayed with fresh inputs.

The step is ``model.forward`` with a static KV cache: every tensor it reads has a fixed shape and
address (inputs are copied into static buffers, the cache tensors never move, the current length
lives on the device), so one capture serves every later step of the same batch size and cache.

First call: run the step eagerly (this warms up lazy initialisation — cuBLAS handles, Triton
autotuning — and *is* the step's result), then capture it. Capture records but does not execute,
so the cache is not advanced twice. Later calls: copy inputs, replay, return the static outputs.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from ..hf_names import CACHE_KWARGS, cache_of
from . import window_layers


def _flatten(kwargs: dict) -> list[tuple[str, torch.Tensor]]:
    """Tensor arguments by stable name; dicts of tensors (hybrid-attention masks) are flattened."""
    out = []
    for k in sorted(kwargs):
        v = kwargs[k]
        if isinstance(v, torch.Tensor):
            out.append((k, v))
        elif isinstance(v, dict):
            out += [(f"{k}.{kk}", vv) for kk, vv in sorted(v.items()) if isinstance(vv, torch.Tensor)]
    return out


def signature(kwargs: dict) -> tuple:
    """What a captured graph depends on: tensor shapes/dtypes and every non-tensor argument."""
    sig = []
    for k in sorted(kwargs):
        v = kwargs[k]
        if isinstance(v, torch.Tensor):
            sig.append((k, tuple(v.shape), v.dtype, v.device))
        elif isinstance(v, dict):
            sig.append((k, tuple((kk, None if vv is None else (tuple(vv.shape), vv.dtype))
                                 for kk, vv in sorted(v.items()))))
        elif k in CACHE_KWARGS:
            sig.append((k, id(v)))
        else:
            sig.append((k, repr(v)))
    return tuple(sig)


def _static_copy(kwargs: dict) -> dict:
    """Clone every tensor argument into a buffer the graph will read from."""
    out = {}
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            out[k] = v.clone()
        elif isinstance(v, dict):
            out[k] = {kk: (vv.clone() if isinstance(vv, torch.Tensor) else vv) for kk, vv in v.items()}
        else:
            out[k] = v
    return out


def run_on_side_stream(fn: Callable[[], Any]) -> Any:
    """``fn()`` eagerly on a side stream, ordered after and before the current stream's work.

    Run once before capturing ``fn``: it warms lazy initialisation (cuBLAS handles, Triton kernels)
    and *is* that step's result, since capture records without executing (state such as a KV cache
    then advances once)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = fn()
    torch.cuda.current_stream().wait_stream(stream)
    return out


def capture_graph(fn: Callable[[], Any], pool) -> tuple[torch.cuda.CUDAGraph, Any]:
    """A CUDA graph of ``fn()`` (recorded, not run) and the outputs it will write on replay."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class GraphedStep:
    def __init__(self, forward: Callable[..., Any], kwargs: dict, pool, capture: bool = True):
        """Run the step once eagerly on ``kwargs`` (kept as ``first_output``) and capture it."""
        self.forward = forward
        self.static_in = _static_copy(kwargs)
        self._buffers = dict(_flatten(self.static_in))
        self.sliding = window_layers.sliding_layers(cache_of(self.static_in))  # their host lengths follow replays
        self.graph = None
        if capture:
            self.first_output = run_on_side_stream(lambda: forward(**self.static_in))
            self.graph, self.static_out = capture_graph(lambda: forward(**self.static_in), pool)
            window_layers.advance(self.sliding, -1)  # counted, not written, by the capture
        else:  # CPU stand-in: same buffers, eager execution (tests the plumbing without a GPU)
            self.first_output = forward(**self.static_in)
            self.static_out = None

    def __call__(self, kwargs: dict) -> Any:
        for name, src in _flatten(kwargs):
            self._buffers[name].copy_(src)
        if self.graph is None:
            return self.forward(**self.static_in)
        self.graph.replay()
        window_layers.advance(self.sliding, 1)  # written on the device, not counted on the host
        return self.static_out
