"""The two-launch greedy advance (``greedy_kernels``) against the torch ops of ``DecodeLoop._advance``:
per case, whether every buffer came out equal (``compare(device)``); and the decode loop that runs them
against HF's tokens (``loop_matches_hf``).

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
from mirage_serve.decode.step_mask import StepMask
from mirage_serve.decode.token_choice import TokenChooser


LENGTH = 40  # the cache's slots: the step mask's columns
HIDDEN = 600  # the embedding rows' width: more than one BLOCK_H at 8 rows, and not a multiple of it
CAPACITY, HEAD_DIM = 500, 24  # the rotary table's positions (below some rows' next position) and head width


def _step_mask(rows: int, slot: int, g: torch.Generator, device: str) -> StepMask:
    """A step mask of random columns (so a column written where it should not be shows) at ``slot``."""
    sm = StepMask(rows, LENGTH, torch.device(device))
    sm.mask.copy_((torch.rand(rows, 1, 1, LENGTH, generator=g) > 0.5).to(device))
    sm.slot.fill_(slot)
    sm.adopted = True
    return sm


def _state(rows: int, vocab: int, g: torch.Generator, t: int, min_new: int, slot: int, device: str):
    eos = torch.zeros(vocab, dtype=torch.bool)
    eos[torch.randint(0, vocab, (3,), generator=g)] = True
    state = dict(eos_mask=eos, t=torch.tensor(t), min_new=torch.tensor(min_new), generated=torch.tensor(5),
                 pad=torch.tensor(7), unfinished=torch.rand(rows, generator=g) > 0.3,
                 tokens=torch.randint(0, vocab, (rows, LENGTH), generator=g),
                 ids=torch.randint(0, vocab, (rows, 1), generator=g),
                 pos=torch.randint(0, 1000, (rows, 1), generator=g))
    return SimpleNamespace(chooser=TokenChooser((), do_sample=False), greedy=None,
                           step_mask=_step_mask(rows, slot, g, device), **{k: v.to(device) for k, v in state.items()})


def _copy(loop: SimpleNamespace) -> SimpleNamespace:
    out = SimpleNamespace(**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in vars(loop).items()})
    rows, _, _, length = loop.step_mask.mask.shape
    out.step_mask = StepMask(rows, length, loop.step_mask.mask.device)
    out.step_mask.mask.copy_(loop.step_mask.mask)
    out.step_mask.slot.copy_(loop.step_mask.slot)
    out.step_mask.adopted = loop.step_mask.adopted
    return out


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
                # (the slot: mid-cache, and the token chosen after the cache's last slot)
                for t, min_new, slot in ((2, 4, 17), (6, 4, LENGTH)):
                    want = _state(rows, vocab, g, t, min_new, slot, device)
                    logits = _logits(rows, vocab, dtype, g, kind, want.eos_mask.cpu()).to(device)
                    got = _copy(want)
                    embed = t == 2  # half the cases also write the next step's embedding rows (step_inputs)
                    if embed:  # and the rotary table's rows at the new positions (RotaryTables.fold_into)
                        got.embed_weight = torch.randn(vocab, HIDDEN, generator=g).to(device, torch.bfloat16)
                        got.embeds = torch.full((rows, 1, HIDDEN), float("nan"), device=device, dtype=torch.bfloat16)
                        table = torch.randn(CAPACITY, 2, HEAD_DIM, generator=g).to(device)
                        got.rotary_rows = (table, torch.full((rows, 1, 2, HEAD_DIM), float("nan"), device=device))
                    DecodeLoop._advance(want, logits)
                    version = got.step_mask.mask._version
                    GreedyAdvance(rows, vocab, device)(logits, got)
                    same = {k: bool(torch.equal(getattr(got, k), getattr(want, k)))
                            for k in ("tokens", "ids", "unfinished", "t", "generated", "pos")}
                    same["step_mask"] = bool(torch.equal(got.step_mask.mask, want.step_mask.mask)
                                             and torch.equal(got.step_mask.slot, want.step_mask.slot))
                    # written in place and announced, as torch's index_fill_ is (attention_searched.additive_mask
                    # converts a mask again only when its version moved)
                    same["mask_version"] = got.step_mask.mask._version > version
                    if embed:  # the rows of the tokens written to ids, padded rows' included
                        same["embeds"] = bool(torch.equal(got.embeds, got.embed_weight[want.ids]))
                        table, rot_rows = got.rotary_rows  # past the table's last row: its last row
                        same["rotary_rows"] = bool(torch.equal(rot_rows, table[want.pos.clamp(max=CAPACITY - 1)]))
                    results[f"{rows}x{vocab}/{str(dtype)[6:]}/{kind}/t{t}"] = same
    return results


def loop_matches_hf() -> dict:
    """The decode loop with these kernels in it (the interpreter takes the GPU's path): a tiny Llama's greedy
    tokens against HF's, left-padded rows, EOS off and on, the cache exactly as long as the generation."""
    from tests.mirage_serve.decode.test_fast_loop import _hf_then_fast, _tiny
    from tests.mirage_serve.decode.test_runner import _left_padded

    from mirage_serve.decode import uninstall_decode_graphs

    model = _tiny("llama")
    ids, mask = _left_padded(3, [5, 9, 3], model.config.vocab_size)
    calls = [(dict(input_ids=ids, attention_mask=mask, max_new_tokens=n, do_sample=False, pad_token_id=0,
                   eos_token_id=eos), None) for n, eos in ((12, None), (9, [5, 17, 40]))]
    want, got, runner = _hf_then_fast(model, calls)
    out = dict(same=[bool(torch.equal(a, b)) for a, b in zip(got, want)], fast=runner.paths["fast"],
               greedy_kernels=all(loop.greedy is not None for loop in runner.loops.values()),
               adopted=[loop.step_mask.adopted for loop in runner.loops.values()],
               # the later steps passed the embedding rows the kernels wrote, not HF's preparation (step_inputs)
               embeds_passed=[loop._direct is not None and loop._direct.get("inputs_embeds") is loop.embeds
                              and loop._direct.get("input_ids") is None for loop in runner.loops.values()],
               rotary_folded=[loop.rotary_rows is not None and loop.rotary.folded is not None
                              for loop in runner.loops.values()])
    uninstall_decode_graphs(model)
    return out


def main() -> None:
    print(json.dumps({"kernels": compare(), "loop": loop_matches_hf()}))


if __name__ == "__main__":
    main()
