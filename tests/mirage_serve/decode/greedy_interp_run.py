"""The two-launch greedy advance (``greedy_kernels``) against the torch ops of ``DecodeLoop._advance``:
per case, whether every buffer came out equal (``compare(device)``).

Run as ``python -m tests.mirage_serve.decode.greedy_interp_run`` in Triton's CPU interpreter
(TRITON_INTERPRET=1, set by ``tests.interpreter.run_interpreted``), it prints them as one JSON line;
the GPU test calls ``compare("cuda")``.
"""
from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from mirage_serve.decode.fast_loop import DecodeLoop
from mirage_serve.decode.greedy_kernels import BLOCK, CHUNK, GreedyAdvance
from mirage_serve.decode.token_choice import TokenChooser


def _state(rows: int, vocab: int, g: torch.Generator, t: int, min_new: int, device: str):
    eos = torch.zeros(vocab, dtype=torch.bool)
    eos[torch.randint(0, vocab, (3,), generator=g)] = True
    state = dict(eos_mask=eos, t=torch.tensor(t), min_new=torch.tensor(min_new), generated=torch.tensor(5),
                 pad=torch.tensor(7), unfinished=torch.rand(rows, generator=g) > 0.3,
                 tokens=torch.randint(0, vocab, (rows, 40), generator=g),
                 ids=torch.randint(0, vocab, (rows, 1), generator=g))
    return SimpleNamespace(chooser=TokenChooser((), do_sample=False), greedy=None,
                           **{k: v.to(device) for k, v in state.items()})


def _logits(rows: int, vocab: int, dtype, g: torch.Generator, kind: str, eos: torch.Tensor) -> torch.Tensor:
    x = torch.randn(rows, vocab, generator=g).to(dtype)
    top = x.float().max() + 1
    if kind == "ties":  # the same largest value in two chunks, in two lanes of one, and twice in one
        for r in range(rows):  # lane (BLOCK apart): the first index wins
            for i in {vocab - 1, vocab // 2, 3 + r, 4 + r, 3 + r + BLOCK}:
                x[r, min(i, vocab - 1)] = top
    if kind == "eos_on_top":  # the largest values on the EOS ids: suppressed or not by min_new
        x[:, eos] = top
    if kind == "nan":  # torch.argmax: NaN is the largest, the first one wins
        x[0, vocab - 2] = float("nan")
        x[0, vocab // 3] = float("nan")
        x[-1, 1] = float("inf")
    if kind == "all_inf":  # every value -inf: index 0
        x[0] = float("-inf")
    return x


def compare(device: str = "cpu") -> dict[str, dict[str, bool]]:
    g = torch.Generator().manual_seed(0)
    results = {}
    for rows, vocab in ((1, 97), (3, CHUNK + 5), (8, 2 * CHUNK + 1000)):
        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            for kind in ("random", "ties", "eos_on_top", "nan", "all_inf"):
                for t, min_new in ((2, 4), (6, 4)):
                    want = _state(rows, vocab, g, t, min_new, device)
                    logits = _logits(rows, vocab, dtype, g, kind, want.eos_mask.cpu()).to(device)
                    got = SimpleNamespace(**{k: (v.clone() if isinstance(v, torch.Tensor) else v)
                                             for k, v in vars(want).items()})
                    DecodeLoop._advance(want, logits)
                    GreedyAdvance(rows, vocab, device)(logits, got)
                    same = {k: bool(torch.equal(getattr(got, k), getattr(want, k)))
                            for k in ("tokens", "ids", "unfinished", "t", "generated")}
                    results[f"{rows}x{vocab}/{str(dtype)[6:]}/{kind}/t{t}"] = same
    return results


def main() -> None:
    print(json.dumps(compare()))


if __name__ == "__main__":
    main()
