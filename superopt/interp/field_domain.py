"""The finite-field Domain: every value as its residue mod p (and mod q, for exponents).

Used by ``superopt.verify`` for probabilistic equivalence testing (Mirage paper §5). A value is a
``FieldValue``: ``.p`` residues in Z_p (the value itself), ``.q`` residues in Z_q (its image in the
exponent ring; ``None`` when the domain does not track it), and ``.s``, a 64-bit multiset signature
carried only by results of ``max``. Structural ops apply to every component. ``.p`` may be int64
or float64 holding exact integers (random inputs are drawn as float64: a weight that only feeds
matmuls then never pays an int→float conversion); arithmetic converts to int64 first.

Meaning of each op (verify/equivalence.py derives the error bound from these choices):

* add, sub, mul, matmul, reduce_sum, neg, square: exact ring arithmetic in Z_p and Z_q.
* div: a · b⁻¹ in both rings, b⁻¹ = b^(m−2) (Fermat); **0⁻¹ is defined as 0** — a divisor
  vanishes at a random point only with small probability, counted in the bound.
* exp(x) = g^(x.q) mod p, g of order q: exp(a + b) = exp(a)·exp(b) exactly. exp's own q-part is a
  keyed hash of x.q: only nested exp (outside the Lax fragment) would read it.
* constants: the float's exact rational value num/den ↦ num · den⁻¹ in each ring.
* opaque unary ops: silu, rsqrt, tanh, gelu_tanh and gelu are first rewritten over the base
  functions sigmoid, sqrt, erf, relu (``interp/canonical.py``: silu(x) = x·sigmoid(x), …); a base
  function is an uninterpreted function — a keyed splitmix64 hash of the argument's residue mod p,
  with a fresh key per (trial seed, op).
* max (binary ``max``, ``reduce_max``, hence ``accum_max``), ``max_model="multiset"`` (default):
  an uninterpreted *symmetric function of the multiset* of its arguments. The signature is the
  wrapping sum of the keyed hashes of the elements, so it is associative and commutative and a
  running max over tiles equals the max over the whole row; the value is a hash of the signature.
  The max of one element is the element. Online-softmax rescaling verifies (its result does not
  depend on the max's value); a missing rescale, or a max over the wrong elements, changes the
  value with probability ~1 − 1/p. Idempotence (max(a, a) = a) is *not* modelled: a rewrite that
  needs it is rejected — a false alarm, never a false pass.
  ``max_model="order"``: max under a random total order (the element with the largest keyed
  hash). It returns one of its inputs and is idempotent, but a candidate that is wrong only when
  some element is the maximum passes a trial with probability up to 1 − 1/n; kept for comparison.
* cast: identity (every dtype is the same field).
"""
from __future__ import annotations

import functools
import zlib
from fractions import Fraction

import numpy as np

from .canonical import expand

_U64 = np.uint64
_EXP_BITS = 11  # exp by three table look-ups of 11 bits each (q < 2^31)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser on uint64 arrays (wrapping arithmetic): a keyed hash's mixer."""
    z = x + _U64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> _U64(27))) * _U64(0x94D049BB133111EB)
    return z ^ (z >> _U64(31))


def _int(a: np.ndarray) -> np.ndarray:
    return a if a.dtype == np.int64 else a.astype(np.int64)


class FieldValue:
    """A tensor of residues: ``p`` (in [0, p), int64 or exact float64), ``q`` (int64 or None), ``s``
    (uint64 or None)."""

    __slots__ = ("p", "q", "s")

    def __init__(self, p: np.ndarray, q: np.ndarray | None = None, s: np.ndarray | None = None):
        self.p, self.q, self.s = p, q, s

    @property
    def shape(self) -> tuple[int, ...]:
        return self.p.shape

    def map(self, f) -> "FieldValue":
        return FieldValue(f(self.p), None if self.q is None else f(self.q), None if self.s is None else f(self.s))

    def __repr__(self) -> str:
        return f"FieldValue(shape={list(self.shape)}, p={self.p!r})"


@functools.lru_cache(maxsize=16)
def _exp_tables(p: int, g: int) -> tuple[np.ndarray, ...]:
    """T_k[i] = g^(i · 2^(11k)) mod p for k = 0, 1, 2: g^e is three look-ups and two products."""
    tables = []
    for k in range(3):
        base = pow(g, 1 << (_EXP_BITS * k), p)
        t = np.empty(1 << _EXP_BITS, dtype=np.int64)
        acc = 1
        for i in range(1 << _EXP_BITS):
            t[i] = acc
            acc = acc * base % p
        tables.append(t)
    return tuple(tables)


def _pow_vec(b: np.ndarray, e: int, m: int) -> np.ndarray:
    """b^e mod m elementwise (square and multiply over the bits of the scalar e)."""
    result = np.ones_like(b)
    base = b % m
    while e:
        if e & 1:
            result = result * base % m
        base = base * base % m
        e >>= 1
    return result


def _limb_plan(k: int, m: int) -> tuple[int, int, int]:
    """(limbs, bits per limb, K chunk): the fewest limbs whose exact chunk is at least min(K, 1024).

    Exact: every partial sum is below chunk · 2^bits · 2^mb ≤ 2^53 (mb = bits of m − 1). For
    p ≈ 2^31: 2 limbs of 16 bits up to K = 64 (block tiles), 3 limbs of 11 bits over chunks of 2048.
    """
    mb = max(1, (m - 1).bit_length())
    limbs = 1
    while True:
        bits = -(-mb // limbs)
        chunk_bits = 53 - mb - bits
        if chunk_bits >= 0 and (1 << chunk_bits) >= min(k, 1024):
            return limbs, bits, min(k, 1 << chunk_bits)
        limbs += 1


def matmul_mod(a: np.ndarray, b: np.ndarray, m: int) -> np.ndarray:
    """Exact (a @ b) mod m for residues in [0, m), m < 2^31, numpy batch broadcasting included.

    The smaller operand splits into limbs (``_limb_plan``); all limbs go through ONE float64 BLAS
    matmul (stacked along rows or columns) per K chunk, and the larger operand is read once,
    unsplit: at M = 8 the matmul is memory-bound.
    """
    k = a.shape[-1]
    limbs, bits, chunk = _limb_plan(k, m)
    out = None
    for start in range(0, k, chunk):
        part = _matmul_chunk(a[..., start:start + chunk], b[..., start:start + chunk, :], m, limbs, bits)
        out = part if out is None else (out + part) % m
    return out


def _matmul_chunk(a: np.ndarray, b: np.ndarray, m: int, limbs: int, bits: int) -> np.ndarray:
    if limbs == 1:
        r = np.matmul(a.astype(np.float64, copy=False), b.astype(np.float64, copy=False))
        return r.astype(np.int64) % m
    split_a = a.size <= b.size
    small, big = (a, b) if split_a else (b, a)
    small, big = small.astype(np.int64, copy=False), big.astype(np.float64, copy=False)
    mask = (1 << bits) - 1
    parts = [((small >> (bits * i)) & mask).astype(np.float64) for i in range(limbs)]
    if split_a:  # rows: [..., L·M, K] @ [..., K, N] -> [..., L, M, N]
        r = np.matmul(np.concatenate(parts, axis=-2), big)
        r = r.reshape(r.shape[:-2] + (limbs, a.shape[-2], r.shape[-1]))
        axis = -3
    else:  # columns: [..., M, K] @ [..., K, L·N] -> [..., M, L, N]
        r = np.matmul(big, np.concatenate(parts, axis=-1))
        r = r.reshape(r.shape[:-1] + (limbs, b.shape[-1]))
        axis = -2
    r = r.astype(np.int64) % m
    out = np.take(r, 0, axis=axis)
    for i in range(1, limbs):
        out = (out + np.take(r, i, axis=axis) * pow(2, bits * i, m)) % m
    return out


class FieldDomain:
    """Arithmetic in Z_p (values) and Z_q (exponents); a fresh ``seed`` gives fresh UF and max keys."""

    name = "field"

    def __init__(self, p: int, q: int, g: int, seed: int = 0, track_q: bool = True,
                 max_model: str = "multiset"):
        if max_model not in ("multiset", "order"):
            raise ValueError(f"FieldDomain: max_model {max_model!r}; expected 'multiset' or 'order'")
        self.p, self.q, self.g = p, q, g
        self.seed = seed
        self.track_q = track_q
        self.max_model = max_model
        self._exp = _exp_tables(p, g) if track_q else None
        self._keys: dict[str, np.uint64] = {}

    # ------------------------------------------------------------ keyed hashes
    def key(self, name: str) -> np.uint64:
        """The trial's key for one uninterpreted function (per seed and op name)."""
        if name not in self._keys:
            mixed = splitmix64(np.array([self.seed & (2**64 - 1)], dtype=_U64))
            mixed = splitmix64(mixed ^ _U64(zlib.crc32(name.encode())))
            self._keys[name] = mixed[0]
        return self._keys[name]

    def _hash(self, name: str, x: np.ndarray) -> np.ndarray:  # x: exact integers, int or float
        return splitmix64(x.astype(_U64) ^ self.key(name))

    def _uf(self, h: np.ndarray) -> FieldValue:
        """A fresh field value from a 64-bit hash (uniform up to a bias below 2^-32)."""
        p = (h % _U64(self.p)).astype(np.int64)
        q = (splitmix64(h) % _U64(self.q)).astype(np.int64) if self.track_q else None
        return FieldValue(p, q)

    def signature(self, x: FieldValue) -> np.ndarray:
        """A value's multiset signature: its own for a max result, else the hash of its residue."""
        return x.s if x.s is not None else self._hash("max", x.p)

    def _from_signature(self, s: np.ndarray) -> FieldValue:
        v = self._uf(splitmix64(s ^ self.key("max.value")))
        v.s = s
        return v

    # ------------------------------------------------------------ arithmetic
    def _pair(self, fp, fq, *xs: FieldValue) -> FieldValue:
        q = fq(*(x.q for x in xs)) if self.track_q else None
        return FieldValue(fp(*(_int(x.p) for x in xs)), q)

    def const(self, value, dtype) -> FieldValue:
        fr = Fraction(value)
        num, den = fr.numerator, fr.denominator
        if den % self.p == 0 or den % self.q == 0:
            raise ValueError(f"FieldDomain: constant {value!r} has a denominator divisible by p or q")
        p = np.array(num * pow(den, -1, self.p) % self.p, dtype=np.int64)
        q = np.array(num * pow(den, -1, self.q) % self.q, dtype=np.int64) if self.track_q else None
        return FieldValue(p, q)

    def unary(self, op, x: FieldValue) -> FieldValue:
        P, Q = self.p, self.q
        if op == "neg":
            return self._pair(lambda a: (-a) % P, lambda a: (-a) % Q, x)
        if op == "square":
            return self._pair(lambda a: a * a % P, lambda a: a * a % Q, x)
        if op == "exp":
            if not self.track_q:
                raise ValueError("FieldDomain: exp needs track_q=True (its exponent lives in Z_q)")
            e = x.q
            t0, t1, t2 = self._exp
            mask = (1 << _EXP_BITS) - 1
            p = t0[e & mask] * t1[(e >> _EXP_BITS) & mask] % P * t2[e >> (2 * _EXP_BITS)] % P
            q = (self._hash("exp.q", x.q) % _U64(Q)).astype(np.int64)
            return FieldValue(p, q)
        # ---- identities between opaque ops (issue 27, search-ops): interp/canonical.py
        rewritten = expand(self, op, x)
        if rewritten is not None:
            return rewritten
        # ---- end of the identities block
        return self._uf(self._hash(op, x.p))

    def binary(self, op, a: FieldValue, b: FieldValue) -> FieldValue:
        P, Q = self.p, self.q
        if op == "add":
            return self._pair(lambda x, y: (x + y) % P, lambda x, y: (x + y) % Q, a, b)
        if op == "sub":
            return self._pair(lambda x, y: (x - y) % P, lambda x, y: (x - y) % Q, a, b)
        if op == "mul":
            return self._pair(lambda x, y: x * y % P, lambda x, y: x * y % Q, a, b)
        if op == "div":
            return self._pair(lambda x, y: x * _pow_vec(y, P - 2, P) % P,
                              lambda x, y: x * _pow_vec(y, Q - 2, Q) % Q, a, b)
        if op == "max":
            if self.max_model == "multiset":
                return self._from_signature(self.signature(a) + self.signature(b))
            pick = self._hash("max", a.p) >= self._hash("max", b.p)
            q = np.where(pick, a.q, b.q) if self.track_q else None
            return FieldValue(np.where(pick, a.p, b.p), q)
        raise ValueError(f"FieldDomain: no binary op {op!r}")

    def reduce(self, op, x: FieldValue, axis, keepdim) -> FieldValue:
        if op == "reduce_sum":
            return self._pair(lambda a: np.sum(a, axis=axis, keepdims=keepdim) % self.p,
                              lambda a: np.sum(a, axis=axis, keepdims=keepdim) % self.q, x)
        if op != "reduce_max":
            raise ValueError(f"FieldDomain: no reduction {op!r}")
        if x.shape[axis] == 1:  # the max of one element is the element
            return x if keepdim else x.map(lambda a: np.squeeze(a, axis=axis))
        if self.max_model == "multiset":  # uint64 sums wrap: a signature mod 2^64
            return self._from_signature(np.sum(self.signature(x), axis=axis, keepdims=keepdim))
        idx = np.argmax(self._hash("max", x.p), axis=axis, keepdims=True)
        v = FieldValue(np.take_along_axis(x.p, idx, axis),
                       np.take_along_axis(x.q, idx, axis) if self.track_q else None)
        return v if keepdim else v.map(lambda a: np.squeeze(a, axis=axis))

    def matmul(self, a: FieldValue, b: FieldValue) -> FieldValue:
        q = matmul_mod(a.q, b.q, self.q) if self.track_q else None
        return FieldValue(matmul_mod(a.p, b.p, self.p), q)  # no int conversion: see matmul_mod

    def cast(self, x, dtype):
        return x

    # ------------------------------------------------------------ data movement
    def shape(self, x: FieldValue):
        return x.p.shape

    def reshape(self, x: FieldValue, shape):
        return x.map(lambda a: np.reshape(a, tuple(shape)))

    def permute(self, x: FieldValue, axes):
        return x.map(lambda a: np.transpose(a, tuple(axes)))

    def concat(self, xs, axis):
        q = np.concatenate([x.q for x in xs], axis=axis) if self.track_q else None
        s = None
        if any(x.s is not None for x in xs):
            s = np.concatenate([self.signature(x) for x in xs], axis=axis)
        return FieldValue(np.concatenate([x.p for x in xs], axis=axis), q, s)

    def slice(self, x: FieldValue, axis, start, stop):
        idx = [slice(None)] * x.p.ndim
        idx[axis] = slice(start, stop)
        return x.map(lambda a: a[tuple(idx)])

    def broadcast_to(self, x: FieldValue, shape):
        return x.map(lambda a: np.broadcast_to(a, tuple(shape)))

    # ------------------------------------------------------------ inputs
    def random_input(self, rng: np.random.Generator, shape, dtype) -> FieldValue:
        """Independent uniform residues mod p (float64: floor(u·p), u uniform on 53-bit dyadics, so
        no residue has probability above 1/p + 2^-53) and, with track_q, mod q."""
        p = rng.random(shape)
        p *= self.p
        np.floor(p, out=p)  # in place: a [4096, 6144] weight is 200 MB
        q = rng.integers(0, self.q, size=shape, dtype=np.int64) if self.track_q else None
        return FieldValue(p, q)
