"""Triton source that asks L2 for bytes a kernel will read soon (PTX ``prefetch.global.L2``).

Two users, one mechanism:
- a kernel launched with programmatic dependent launch is resident, waiting for its predecessor, while the
  predecessor still runs; before it waits, each block asks L2 for its share of the kernel's large inputs
  (``codegen.triton.render_triton(l2_prefetch=True)``), so the weights stream in during the predecessor's tail;
- a persistent task asks for its share of the weights before its dependency waits (``codegen.persistent``).

A prefetch is a hint: it changes no value, faults on no in-bounds address and may be dropped, and L2 is the GPU's
point of coherence, so asking for a line another kernel is about to write is harmless (the write updates L2).
It is GPU-only: Triton's interpreter cannot run inline PTX. This module writes text only.
"""
from __future__ import annotations

LINE = 128  # bytes of an L2 line: one prefetch asks for one
LANES = 128  # lines one statement asks for, one a lane
_ASM = "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];"  # (inline asm must give a result: a dummy)


def prefetch_range(address: str, start: str, end: str, indent: int) -> list[str]:
    """Lines asking L2 for bytes ``[start, end)`` past ``address`` (Triton expressions: an int64 byte address and
    int64 offsets), one 128-byte line a lane, ``LANES`` lines a statement."""
    pad = "    " * indent
    return [f"{pad}for at in range({start}, {end}, {LANES * LINE}):",
            f"{pad}    lane = at + tl.arange(0, {LANES}).to(tl.int64) * {LINE}",
            f"{pad}    addr = {address} + tl.where(lane < {end}, lane, at)",
            f"{pad}    tl.inline_asm_elementwise({_ASM!r}, \"=r,l\", [addr], dtype=tl.int32, is_pure=False, pack=1)"]


def block_share(nbytes: int, blocks: int, cap: int) -> tuple[int, int]:
    """(stride, span): block ``b`` of ``blocks`` asks for bytes ``[b * stride, b * stride + span)`` of an input of
    ``nbytes``: its even share, whole lines, at most ``cap`` bytes of it. The blocks of a grid over an output's
    rows read a row-major weight's rows in this order, so a block's share is the start of its own tiles; where a
    grid cuts the weight otherwise, the shares still cover the kernel's first bytes of each part."""
    stride = -(-nbytes // blocks // LINE) * LINE or LINE
    return stride, min(stride, max(LINE, cap // LINE * LINE))
