"""Why Gemma-2's sampling check failed on the GPU (0.22, issue 28): stale sliding-layer host lengths.

    PYTHONPATH=$PWD python benchmarks/window_lengths_cpu.py

A sliding-window cache layer keeps its length on the device and as a host int; HF's decode loop
builds each step's masks on the host from the int. A CUDA-graph capture runs the step's Python
(the int counts one token the capture never writes) and a replay runs none (the int does not count
the token the replay writes). Before ``decode/window_layers.advance`` nothing corrected either.

No GPU needed: a tiny Gemma-2 and a tiny Phi-3 (window 64, float32) generate 12 greedy tokens with
``output_logits`` (HF's loop, one graphed step per token) through the decode runner with capture
off, and the host ints are moved as a real capture and real replays would leave them: "stale" as
the code did before, "kept" as it does now. Printed: the relative error of each step's logits
against the unpatched model's.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from mirage_serve.decode import graph_step, install_decode_graphs, uninstall_decode_graphs, window_layers  # noqa: E402
from mirage_serve.hf_names import cache_of  # noqa: E402
from tests.mirage_serve.decode.test_runner import _left_padded  # noqa: E402
from tests.mirage_serve.decode.test_window_layers import tiny  # noqa: E402


def run(kind: str, stale: bool) -> list[float]:
    model = tiny(kind, window=64)
    ids, mask = _left_padded(1, [7], model.config.vocab_size)
    kw = dict(input_ids=ids, attention_mask=mask, max_new_tokens=12, do_sample=False, pad_token_id=0,
              eos_token_id=None, return_dict_in_generate=True, output_logits=True)
    want = torch.stack(model.generate(**kw).logits, 1)[0]
    real_init, real_call = graph_step.GraphedStep.__init__, graph_step.GraphedStep.__call__

    def init(self, forward, kwargs, pool, capture=True):  # eager first step; then what a capture counts
        real_init(self, forward, kwargs, pool, capture=False)
        if stale:
            window_layers.advance(cache_of(self.static_in).layers, 1)

    def call(self, kwargs):  # eager step (it counts its token); then what a replay leaves uncounted
        out = real_call(self, kwargs)
        if stale:
            window_layers.advance(cache_of(self.static_in).layers, -1)
        return out

    graph_step.GraphedStep.__init__, graph_step.GraphedStep.__call__ = init, call
    try:
        install_decode_graphs(model, capture=False)
        got = torch.stack(model.generate(**kw).logits, 1)[0]
        uninstall_decode_graphs(model)
    finally:
        graph_step.GraphedStep.__init__, graph_step.GraphedStep.__call__ = real_init, real_call
    return [((g - w).norm() / w.norm()).item() for g, w in zip(got, want)]


if __name__ == "__main__":
    print("model   host lengths  relative logit error at decode steps 0..11 (step 0: prefill)")
    for kind in ("gemma2", "phi3"):  # hybrid (alternate layers sliding); every layer sliding (Phi-3's 2047)
        for stale in (True, False):
            print(f"{kind:7} {'stale' if stale else 'kept':13} " + " ".join(f"{e:.1e}" for e in run(kind, stale)))
