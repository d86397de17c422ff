"""Lax programs: a builder for the tensor programs the superoptimizer takes as its specification.

A Lax program is a kernel graph of library ops. People build one with ``Program``; the patcher
builds one from a traced module (``superopt.lax.extract``). Composites (``rms_norm``,
``softmax``, ``mean``) expand to primitives so the verifier sees only ops of the op table.

    p = Program("rmsnorm_matmul")
    x = p.input("x", (8, 4096), "float16")
    w = p.input("w", (4096, 6144), "float16")
    p.output(p.matmul(p.rms_norm(x, eps=1e-6), w))
    graph = p.build()
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..ir import KernelGraph, Node, TensorType, Value, check, infer_type, make_attrs
from ..ir.movement import INDEX_DTYPES
from ..ir.ops import OPS, Lax
from ..ir.shapes import ShapeError, normalize_dim

__all__ = ["Program", "T", "lax_status"]


@dataclass(frozen=True)
class T:
    """A handle to a value of the program being built."""

    name: str
    type: TensorType

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype


def lax_status(op: str) -> Lax:
    """Whether ``op`` is in the Lax fragment (multilinear, division, exp) or opaque/structural."""
    return OPS[op].lax


class Program:
    def __init__(self, name: str = "program"):
        self.name = name
        self._inputs: list[Value] = []
        self._nodes: list[Node] = []
        self._outputs: list[str] = []
        self._names: set[str] = set()
        self._counter = 0

    # ------------------------------------------------------------ plumbing
    def _fresh(self, hint: str) -> str:
        while True:
            name = f"{hint}{self._counter}"
            self._counter += 1
            if name not in self._names:
                return name

    def _emit(self, op: str, args: Sequence[T], **attrs) -> T:
        for i, a in enumerate(args):
            if not isinstance(a, T):
                raise TypeError(f"{op}: operand {i} is {type(a).__name__}, expected a value of this "
                                f"program (use p.const(x) for numbers)")
        at = make_attrs(**attrs)
        t = infer_type(op, [a.type for a in args], at)
        name = self._fresh("t")
        self._names.add(name)
        self._nodes.append(Node(op, tuple(a.name for a in args), (Value(name, t),), at))
        return T(name, t)

    def _lift(self, x, like: T) -> T:
        return x if isinstance(x, T) else self.const(x, like.dtype)

    # ------------------------------------------------------------ inputs / outputs
    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> T:
        if name in self._names:
            raise ValueError(f"input: name {name!r} is already used in program {self.name!r}")
        shape = tuple(int(s) for s in shape)
        if any(s <= 0 for s in shape):
            raise ShapeError(f"input {name!r}: dims must be positive, got {list(shape)}")
        t = TensorType(shape, dtype)
        if dtype not in INDEX_DTYPES:  # positions (gather / scatter) are int64; values are floats
            infer_type("cast", [t], make_attrs(dtype=dtype))  # validates the dtype
        self._names.add(name)
        self._inputs.append(Value(name, t))
        return T(name, t)

    def output(self, *values: T) -> None:
        for v in values:
            self._outputs.append(v.name)

    def build(self) -> KernelGraph:
        return check(KernelGraph(tuple(self._inputs), tuple(self._nodes), tuple(self._outputs), self.name))

    # ------------------------------------------------------------ primitives
    def const(self, value: float, dtype: str = "float32") -> T:
        return self._emit("const", [], value=float(value), dtype=dtype)

    def add(self, a, b): return self._emit("add", [a, self._lift(b, a)])
    def sub(self, a, b): return self._emit("sub", [a, self._lift(b, a)])
    def mul(self, a, b): return self._emit("mul", [a, self._lift(b, a)])
    def div(self, a, b): return self._emit("div", [a, self._lift(b, a)])
    def exp(self, a): return self._emit("exp", [a])
    def neg(self, a): return self._emit("neg", [a])
    def square(self, a): return self._emit("square", [a])
    def sqrt(self, a): return self._emit("sqrt", [a])
    def rsqrt(self, a): return self._emit("rsqrt", [a])
    def silu(self, a): return self._emit("silu", [a])
    def gelu_tanh(self, a): return self._emit("gelu_tanh", [a])
    def sigmoid(self, a): return self._emit("sigmoid", [a])
    def tanh(self, a): return self._emit("tanh", [a])
    def matmul(self, a, b): return self._emit("matmul", [a, b])
    def transpose(self, a): return self._emit("transpose", [a])
    def cast(self, a, dtype: str): return self._emit("cast", [a], dtype=dtype)

    def sum(self, a: T, dim: int, keepdim: bool = False) -> T:
        return self._emit("reduce_sum", [a], dim=normalize_dim("sum", dim, a.type.rank), keepdim=int(keepdim))

    def max(self, a: T, dim: int, keepdim: bool = False) -> T:
        return self._emit("reduce_max", [a], dim=normalize_dim("max", dim, a.type.rank), keepdim=int(keepdim))

    def reshape(self, a: T, shape: Sequence[int]) -> T:
        return self._emit("reshape", [a], shape=tuple(int(s) for s in shape))

    def concat(self, values: Sequence[T], dim: int) -> T:
        return self._emit("concat", list(values), dim=normalize_dim("concat", dim, values[0].type.rank))

    def slice(self, a: T, dim: int, start: int, stop: int) -> T:
        return self._emit("slice", [a], dim=normalize_dim("slice", dim, a.type.rank), start=start, stop=stop)

    def split(self, a: T, sizes: Sequence[int], dim: int) -> list[T]:
        d = normalize_dim("split", dim, a.type.rank)
        if sum(sizes) != a.shape[d]:
            raise ShapeError(f"split: sizes {list(sizes)} sum to {sum(sizes)}, but dim {d} of "
                             f"{list(a.shape)} has {a.shape[d]}")
        out, start = [], 0
        for s in sizes:
            out.append(self.slice(a, d, start, start + s))
            start += s
        return out

    # ---- data movement (ir/movement.py) ----
    def chunk(self, a: T, chunks: int, dim: int) -> list[T]:
        """``torch.chunk``: pieces of ceil(n / chunks), the last one shorter."""
        n = a.shape[normalize_dim("chunk", dim, a.type.rank)]
        size = -(-n // chunks)
        return self.split(a, [min(size, n - s) for s in range(0, n, size)], dim)

    def permute(self, a: T, perm: Sequence[int]) -> T:
        r = a.type.rank
        return self._emit("permute", [a], perm=tuple(normalize_dim("permute", int(d), r) for d in perm))

    def swap_dims(self, a: T, d0: int, d1: int) -> T:
        """``torch.transpose(a, d0, d1)`` of any two dims."""
        r = a.type.rank
        perm = list(range(r))
        i, j = normalize_dim("transpose", d0, r), normalize_dim("transpose", d1, r)
        perm[i], perm[j] = perm[j], perm[i]
        return self.transpose(a) if {i, j} == {r - 2, r - 1} else self.permute(a, perm)

    def repeat_interleave(self, a: T, times: int, dim: int) -> T:
        """Each slice along ``dim`` ``times`` times in place: GQA's head repeat (HF ``repeat_kv``)."""
        return self._emit("repeat", [a], dim=normalize_dim("repeat", dim, a.type.rank), times=int(times))

    def gather(self, a: T, index: T, dim: int) -> T:
        """``a.index_select(dim, index)``: rows at positions (RoPE cos / sin at the current position)."""
        return self._emit("gather", [a, index], dim=normalize_dim("gather", dim, a.type.rank))

    def scatter(self, a: T, index: T, src: T, dim: int) -> T:
        """``a.index_copy(dim, index, src)`` as a new value: the KV cache after writing ``src`` at
        the positions ``index`` (functional form of HF StaticCache's ``index_copy_``)."""
        return self._emit("scatter", [a, index, src], dim=normalize_dim("scatter", dim, a.type.rank))

    def rotate_half(self, x: T) -> T:
        """cat(−x₂, x₁) over the last dim: RoPE's rotation as HF writes it."""
        h = x.shape[-1] // 2
        x1, x2 = self.slice(x, -1, 0, h), self.slice(x, -1, h, x.shape[-1])
        return self.concat([self.neg(x2), x1], -1)

    def rope(self, x: T, cos: T, sin: T) -> T:
        """x·cos + rotate_half(x)·sin (HF ``apply_rotary_pos_emb``, one tensor)."""
        return self.add(self.mul(x, cos), self.mul(self.rotate_half(x), sin))
    # ---- end data movement ----

    # ------------------------------------------------------------ composites
    def mean(self, a: T, dim: int, keepdim: bool = False) -> T:
        # sum / n with an integer n: exact in every Domain (1/n as a float would not be).
        n = a.shape[normalize_dim("mean", dim, a.type.rank)]
        return self.div(self.sum(a, dim, keepdim), self.const(n, a.dtype))

    def rms_norm(self, x: T, weight: T | None = None, eps: float = 1e-6, dim: int = -1) -> T:
        """x · rsqrt(mean(x², dim) + eps) [· weight]."""
        ms = self.mean(self.square(x), dim, keepdim=True)
        y = self.mul(x, self.rsqrt(self.add(ms, self.const(eps, x.dtype))))
        return y if weight is None else self.mul(y, weight)

    # ---- activations and norms of HF decoders (issue 27, search-ops): superopt/lax/activations.py
    def gelu(self, a): return self._emit("gelu", [a])
    def erf(self, a): return self._emit("erf", [a])
    def relu(self, a): return self._emit("relu", [a])

    def layer_norm(self, x: T, weight: T | None = None, bias: T | None = None, eps: float = 1e-5,
                   dim: int = -1, offset: float = 0.0) -> T:
        """LayerNorm; ``offset=1`` gives the (1 + w) / LayerNorm1p forms (see ``activations``)."""
        from .activations import layer_norm
        return layer_norm(self, x, weight, bias, eps, dim, offset)

    def activation(self, name: str, x: T) -> T:
        """``transformers`` ``ACT2FN[name]`` as Lax ops (``activations.ACT_NAMES`` lists them)."""
        from .activations import activation
        return activation(self, name, x)
    # ---- end of the activations block

    def softmax(self, x: T, dim: int = -1, stable: bool = False) -> T:
        """exp(x) / Σ exp(x); ``stable`` subtracts the max first (the verifier treats max as opaque)."""
        if stable:
            x = self.sub(x, self.max(x, dim, keepdim=True))
        e = self.exp(x)
        return self.div(e, self.sum(e, dim, keepdim=True))
