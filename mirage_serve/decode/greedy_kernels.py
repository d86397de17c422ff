"""Greedy token choice and the decode loop's bookkeeping in two launches.

``DecodeLoop._advance`` written as torch ops is about a dozen launches a token: the float32 copy of
the logits, the EOS suppression, ``argmax`` (one block reducing a 150k-wide row: 8–27 µs on an
H100), then HF's bookkeeping (``generated``, padding finished rows, the token written, ``unfinished``,
``ids``, ``t``). A 0.5–1B model's step is ~200 launches of 1–3 µs each, so these are several % of
it (issue 29; docs/architecture.md, "From a decode step to the GPU"). For greedy decoding without warpers (the
case whose result is an argmax of the raw logits) two kernels do the same:

1. ``_partial_argmax``, grid (rows, chunks): the largest value of its chunk of one row and the first
   index holding it, reading the logits in their own dtype (the float32 upcast is exact), EOS ids
   at −inf while fewer than ``min_new`` tokens were generated (HF's min-length processors);
2. ``_choose_and_book``, one program: per row the first index of the largest chunk maximum, which
   is ``torch.argmax``'s answer (ties: the first occurrence; NaN counts as the largest, and the first
   NaN wins), then ``_advance``'s bookkeeping, op for op, and the next step's inputs that do not
   depend on the token: each row's position one further, and the step mask's next column
   (``step_mask.StepMask.advance``). Those were three torch launches of their own a step. Where the loop
   passes the next step's embedding itself (``step_inputs``), also each row's embedding row of its token,
   which was the embedding's own gather launch, and the rotary table's rows at the new positions, which were the
   rotary module's gather (``rotary_table.RotaryTables.fold_into``).

Sampling and warpers keep the torch ops (``token_choice.TokenChooser``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

# logits a program of the first kernel scans, BLOCK lanes at a time: ~75 programs a row at a 150k
# vocabulary. Latency, not bandwidth, sets this kernel's time: on an H100 (Qwen3-0.6B, b1) it took
# 6.5 µs at 8192 a program (8 loads in turn) and 2.2 µs at 2048 (benchmarks/results/floor_2026-11-27_s28).
CHUNK = 2048
BLOCK = 1024
NONE = 2**31 - 1  # "no index": above any vocabulary index


@triton.jit
def _partial_argmax(logits_ptr, l_sb, V, eos_ptr, t_ptr, min_new_ptr, val_ptr, idx_ptr, nan_ptr,
                    CHUNK: tl.constexpr, BLOCK: tl.constexpr, NONE: tl.constexpr):
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    parts = tl.num_programs(1)
    suppress = tl.load(t_ptr) < tl.load(min_new_ptr)
    lane = tl.arange(0, BLOCK)
    best_v = tl.full([BLOCK], float("-inf"), tl.float32)
    best_i = tl.full([BLOCK], NONE, tl.int32)
    nan_i = tl.full([BLOCK], NONE, tl.int32)
    for s in range(0, CHUNK, BLOCK):
        offs = chunk * CHUNK + s + lane
        ok = offs < V
        x = tl.load(logits_ptr + row * l_sb + offs, mask=ok, other=float("-inf")).to(tl.float32)
        eos = tl.load(eos_ptr + offs, mask=ok, other=0) != 0
        x = tl.where(suppress & eos, float("-inf"), x)
        is_nan = x != x
        nan_i = tl.where(ok & is_nan & (nan_i == NONE), offs, nan_i)
        # a lane keeps the first index of its largest value: offsets only grow, so "strictly
        # greater" keeps the first; its first valid value is always taken (a row of -inf has an argmax)
        take = ok & (~is_nan) & ((x > best_v) | (best_i == NONE))
        best_v = tl.where(take, x, best_v)
        best_i = tl.where(take, offs, best_i)
    m = tl.max(best_v, 0)
    i = tl.min(tl.where((best_v == m) & (best_i != NONE), best_i, NONE), 0)
    out = row * parts + chunk
    tl.store(val_ptr + out, m)
    tl.store(idx_ptr + out, i)
    tl.store(nan_ptr + out, tl.min(nan_i, 0))


@triton.jit
def _choose_and_book(val_ptr, idx_ptr, nan_ptr, rows, parts, unfinished_ptr, pad_ptr, tokens_ptr, tok_sb,
                     eos_ptr, ids_ptr, ids_sb, t_ptr, generated_ptr, pos_ptr, pos_sb, mask_ptr, mask_sb, mask_len,
                     slot_ptr, emb_ptr, emb_sr, hidden, embeds_ptr, embeds_sb, rot_ptr, rot_cap, rot_n, rows_ptr,
                     BLOCK_B: tl.constexpr, BLOCK_S: tl.constexpr, NONE: tl.constexpr,
                     EMBED: tl.constexpr, BLOCK_H: tl.constexpr, ROT: tl.constexpr, BLOCK_R: tl.constexpr):
    r = tl.arange(0, BLOCK_B)
    s = tl.arange(0, BLOCK_S)
    r_ok = r < rows
    ok = r_ok[:, None] & (s < parts)[None, :]
    at = r[:, None] * parts + s[None, :]
    v = tl.load(val_ptr + at, mask=ok, other=float("-inf"))
    i = tl.load(idx_ptr + at, mask=ok, other=NONE)
    first_nan = tl.min(tl.load(nan_ptr + at, mask=ok, other=NONE), 1)
    m = tl.max(v, 1)
    best = tl.min(tl.where(v == m[:, None], i, NONE), 1)
    tok = tl.where(first_nan != NONE, first_nan, best).to(tl.int64)
    # The state this program updates in place is read before any of it is written, with a barrier between: Triton
    # loads an element in every thread that holds a copy of it but stores it from one, so a warp that ran ahead
    # could store a new position (or t, or slot) that a slower warp then loads as the old one.
    unf = tl.load(unfinished_ptr + r, mask=r_ok, other=0) != 0
    generated = tl.load(generated_ptr)
    t = tl.load(t_ptr)
    pos = tl.load(pos_ptr + r * pos_sb, mask=r_ok, other=0)
    slot = tl.load(slot_ptr)
    tl.debug_barrier()
    # HF's bookkeeping, in _advance's order
    tl.store(generated_ptr, generated + tl.max(unf.to(tl.int64), 0))
    tok = tl.where(unf, tok, tl.load(pad_ptr))
    tl.store(tokens_ptr + r * tok_sb + t, tok, mask=r_ok)
    hit = tl.load(eos_ptr + tok, mask=r_ok, other=0) != 0
    tl.store(unfinished_ptr + r, unf & ~hit, mask=r_ok)
    tl.store(ids_ptr + r * ids_sb, tok, mask=r_ok)
    if EMBED:  # the next step's input embedding: the token's row of the embedding (step_inputs.embedding_weight)
        for h0 in range(0, hidden, BLOCK_H):
            h = h0 + tl.arange(0, BLOCK_H)
            rh_ok = r_ok[:, None] & (h < hidden)[None, :]
            row = tl.load(emb_ptr + tok[:, None] * emb_sr + h[None, :], mask=rh_ok)
            tl.store(embeds_ptr + r[:, None] * embeds_sb + h[None, :], row, mask=rh_ok)
    tl.store(t_ptr, t + 1)
    # the next step's position and step-mask column, as StepMask.advance sets it (past the cache: the last one)
    new_pos = pos + 1
    tl.store(pos_ptr + r * pos_sb, new_pos, mask=r_ok)
    if ROT:  # the rotary table's (cos, sin) rows at the new positions (rotary_table.RotaryTables.fold_into)
        c = tl.arange(0, BLOCK_R)
        at = tl.minimum(new_pos, rot_cap - 1)  # past the cache's last slot: a row no step reads
        rc_ok = r_ok[:, None] & (c < rot_n)[None, :]
        rot = tl.load(rot_ptr + at[:, None] * rot_n + c[None, :], mask=rc_ok)
        tl.store(rows_ptr + r[:, None] * rot_n + c[None, :], rot, mask=rc_ok)
    tl.store(mask_ptr + r * mask_sb + tl.minimum(slot, mask_len - 1), tl.full([BLOCK_B], 1, tl.int1), mask=r_ok)
    tl.store(slot_ptr, slot + 1)


class GreedyAdvance:
    """``loop._advance(logits)`` for greedy decoding without warpers, in two launches; scratch
    buffers for ``rows`` rows of a ``vocab``-wide vocabulary, allocated once (a graph replays them)."""

    def __init__(self, rows: int, vocab: int, device):
        self.rows, self.vocab = rows, vocab
        self.parts = triton.cdiv(vocab, CHUNK)
        self.val = torch.empty(rows * self.parts, dtype=torch.float32, device=device)
        self.idx = torch.empty(rows * self.parts, dtype=torch.int32, device=device)
        self.nan = torch.empty(rows * self.parts, dtype=torch.int32, device=device)

    def __call__(self, logits: torch.Tensor, loop) -> None:
        if tuple(logits.shape) != (self.rows, self.vocab):
            raise ValueError(f"GreedyAdvance: logits of shape {tuple(logits.shape)}, expected ({self.rows}, "
                             f"{self.vocab}) (rows, the config's vocabulary)")
        if logits.stride(-1) != 1:
            logits = logits.contiguous()
        mask = loop.step_mask.mask  # [rows, 1, 1, L]: a row's columns at unit stride
        weight, embeds = getattr(loop, "embed_weight", None), getattr(loop, "embeds", None)
        embed = weight is not None and embeds is not None
        table, rows = getattr(loop, "rotary_rows", None) or (None, None)  # [capacity, 2, d], [rows, 1, 2, d]
        rot_n = table[0].numel() if table is not None else 0  # a position's (cos, sin) row
        _partial_argmax[(self.rows, self.parts)](
            logits, logits.stride(0), self.vocab, loop.eos_mask, loop.t, loop.min_new, self.val, self.idx, self.nan,
            CHUNK=CHUNK, BLOCK=BLOCK, NONE=NONE)
        _choose_and_book[(1,)](
            self.val, self.idx, self.nan, self.rows, self.parts, loop.unfinished, loop.pad, loop.tokens,
            loop.tokens.stride(0), loop.eos_mask, loop.ids, loop.ids.stride(0), loop.t, loop.generated,
            loop.pos, loop.pos.stride(0), mask, mask.stride(0), mask.shape[-1], loop.step_mask.slot,
            weight if embed else self.val, weight.stride(0) if embed else 0, weight.shape[1] if embed else 0,
            embeds if embed else self.val, embeds.stride(0) if embed else 0,
            self.val if table is None else table, 0 if table is None else table.shape[0], rot_n,
            self.val if rows is None else rows,
            BLOCK_B=triton.next_power_of_2(self.rows), BLOCK_S=triton.next_power_of_2(self.parts), NONE=NONE,
            EMBED=embed, BLOCK_H=max(64, 4096 // triton.next_power_of_2(self.rows)),
            ROT=table is not None, BLOCK_R=max(16, triton.next_power_of_2(rot_n)))
        # The mask was written in place, as index_fill_ writes it: say so as torch would. The searched attention
        # converts a step's mask once and reuses it while its version is unchanged (attention_searched.additive_mask);
        # unannounced, the capture after the first step would find the conversion current and record none.
        torch.autograd.graph.increment_version(mask)
