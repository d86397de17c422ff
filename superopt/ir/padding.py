"""Padded tile shapes of the Triton renderer: every tile dim rounded up to what Triton can hold.

Triton tensors have power-of-two extents, and ``tl.dot`` needs M, N, K ≥ 16 (small-M matmuls
are rendered without it, ``fma_matmul``, and keep their own extents). A block value of
shape [3, 80] therefore lives in registers as [16, 128] with the real elements in the leading
corner. Dims that must agree (both operands of an elementwise op, the contracted dims of a
matmul, an accumulator and its operand) are unified, so one padded extent serves them all and
operands broadcast in Triton exactly as they do in the μGraph. Padded elements hold garbage:
loads fill them with 0, every reduction and contraction masks them, stores never write them.
"""
from __future__ import annotations

from .graph import BlockGraph
from .ops import Category, op_info

WGMMA_MIN_ROWS = 64  # a warpgroup's wgmma rows: a dot with fewer rows and at least this many columns is swapped

DOT_MIN = 16  # tl.dot's smallest M, N and K
FMA_MAX_ROWS = 4       # a rank-2 matmul with M or N this small is a broadcast product + sum, not tl.dot
FMA_MAX_ELEMS = 8192   # ... if its [M, N, K] product (padded) fits in registers (64 a thread at 4 warps)


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


class _Classes:
    """Union-find over (value, dim) pairs; each class keeps its smallest allowed padded extent."""

    def __init__(self) -> None:
        self.parent: dict[tuple[str, int], tuple[str, int]] = {}
        self.floor: dict[tuple[str, int], int] = {}

    def add(self, key: tuple[str, int], real: int) -> None:
        self.parent[key] = key
        self.floor[key] = next_pow2(real)

    def find(self, k: tuple[str, int]) -> tuple[str, int]:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: tuple[str, int], b: tuple[str, int]) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[rb] = ra
            self.floor[ra] = max(self.floor[ra], self.floor[rb])

    def at_least(self, k: tuple[str, int], n: int) -> None:
        r = self.find(k)
        self.floor[r] = max(self.floor[r], n)


def fma_matmul(a: tuple[int, ...], w: tuple[int, ...]) -> bool:
    """Whether the renderer writes ``matmul(a, w)`` as ``tl.sum`` of a broadcast product.

    A decode GEMV ([1, K] @ [K, N]) as ``tl.dot`` pads M to 16: 16× the multiplies, and both
    operands staged through shared memory every iteration. Rank 2 only (batched dots stay dots).
    """
    if len(a) != 2 or len(w) != 2:
        return False
    m, k, n = a[0], a[1], w[1]
    return min(m, n) <= FMA_MAX_ROWS and next_pow2(m) * next_pow2(k) * next_pow2(n) <= FMA_MAX_ELEMS


def padded_shapes(b: BlockGraph, strict: bool = True) -> dict[str, tuple[int, ...]]:
    """The register shape of every block value (inputs and nodes) of ``b``.

    ``strict=False`` pads the dims of ops Triton cannot render (concat, slice) on their own
    instead of raising: the shared-memory estimate still covers graphs only the CUDA renderer takes.
    """
    shapes: dict[str, tuple[int, ...]] = {i.value.name: i.value.type.shape for i in b.inputs}
    shapes.update((n.out.name, n.out.type.shape) for n in b.nodes)
    cls = _Classes()
    for name, s in shapes.items():
        for d, real in enumerate(s):
            cls.add((name, d), real)

    def tie_broadcast(out: str, arg: str) -> None:
        # right-aligned like numpy; a dim of 1 against a larger one broadcasts, never unifies
        so, sa = shapes[out], shapes[arg]
        for i in range(1, len(sa) + 1):
            if sa[-i] == so[-i]:
                cls.union((out, len(so) - i), (arg, len(sa) - i))

    for n in b.nodes:
        out, cat = n.out.name, op_info(n.op).category
        if cat in (Category.UNARY, Category.BINARY) or n.op == "cast":
            for a in n.args:
                tie_broadcast(out, a)
        elif cat is Category.ACCUM:
            tie_broadcast(out, n.args[0])
            if n.op == "accum_sum_rescaled":
                tie_broadcast(out, n.args[1])
        elif cat is Category.REDUCE:
            dim, keep = n.attr("dim"), bool(n.attr("keepdim"))
            src = shapes[n.args[0]]
            for d in range(len(src)):
                if d == dim:
                    continue
                cls.union((out, d if keep or d < dim else d - 1), (n.args[0], d))
        elif cat is Category.MATMUL:
            a, w = n.args
            ra, rw, ro = len(shapes[a]), len(shapes[w]), len(shapes[out])
            for i in range(3, ro + 1):  # batch dims broadcast
                if i <= ra and shapes[a][-i] == shapes[out][-i]:
                    cls.union((out, ro - i), (a, ra - i))
                if i <= rw and shapes[w][-i] == shapes[out][-i]:
                    cls.union((out, ro - i), (w, rw - i))
            cls.union((out, ro - 2), (a, ra - 2))
            cls.union((out, ro - 1), (w, rw - 1))
            cls.union((a, ra - 1), (w, rw - 2))
            if not fma_matmul(shapes[a], shapes[w]):
                for k in ((out, ro - 2), (out, ro - 1), (a, ra - 1)):
                    cls.at_least(k, DOT_MIN)
        elif n.op == "transpose":
            s = shapes[out]
            for d in range(len(s)):
                src_d = {len(s) - 1: len(s) - 2, len(s) - 2: len(s) - 1}.get(d, d)
                cls.union((out, d), (n.args[0], src_d))
        elif n.op == "permute":  # ---- data movement (ir/movement.py) ----
            for d, src_d in enumerate(n.attr("perm")):
                cls.union((out, d), (n.args[0], src_d))
        elif n.op in ("concat", "slice"):  # the moved dim pads on its own, the others tie
            for a in n.args:
                for d in range(len(shapes[out])):
                    if d != n.attr("dim"):
                        cls.union((out, d), (a, d))
        elif cat is not Category.CONST and strict:
            raise NotImplementedError(f"render_triton: block-level op {n.op!r} is not supported "
                                      f"(concat/slice inside a block graph have no Triton form)")
    return {name: tuple(cls.floor[cls.find((name, d))] for d in range(len(s))) for name, s in shapes.items()}
