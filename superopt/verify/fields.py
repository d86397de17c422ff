"""The finite fields of the verifier: primes p, q with q | p − 1 and g of order q in Z_p*.

Values live in Z_p; exponents of ``exp`` live in Z_q, and exp(x) ↦ g^(x mod q) mod p is an
injective group homomorphism (Z_q, +) → (Z_p*, ×), so exp(a + b) = exp(a)·exp(b) holds exactly.
p < 2^31 keeps every product of two residues inside int64 and lets ``FieldDomain.matmul`` run
exact float64 matmuls on 16-bit limbs. The search is deterministic, so a seed reproduces a run.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

# Deterministic Miller–Rabin bases: correct for every n < 3.3·10^24 (far above our 2^31).
_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for b in _MR_BASES:
        if n % b == 0:
            return n == b
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@dataclass(frozen=True)
class Field:
    """Z_p for values, Z_q for exponents; ``g`` generates the order-q subgroup of Z_p*."""

    p: int
    q: int
    g: int

    def __post_init__(self):
        if not (is_prime(self.p) and is_prime(self.q)):
            raise ValueError(f"Field: p={self.p} and q={self.q} must both be prime")
        if (self.p - 1) % self.q:
            raise ValueError(f"Field: q={self.q} does not divide p-1={self.p - 1}")
        if self.p >= 2**31:
            raise ValueError(f"Field: p={self.p} must be below 2^31 (int64 products, exact limb matmul)")
        if self.g % self.p in (0, 1) or pow(self.g, self.q, self.p) != 1:
            raise ValueError(f"Field: g={self.g} does not have order q={self.q} in Z_{self.p}*")

    def __str__(self) -> str:
        return f"Z_p (p={self.p}, q={self.q})"


def _subgroup_generator(p: int, q: int) -> int:
    """The smallest g = a^((p-1)/q) ≠ 1: an element of order exactly q (q prime)."""
    for a in range(2, p):
        g = pow(a, (p - 1) // q, p)
        if g != 1:
            return g
    raise ValueError(f"no element of order {q} in Z_{p}*")


@functools.lru_cache(maxsize=None)
def make_field(q_at_least: int, max_k: int = 1000) -> Field:
    """The first prime q ≥ ``q_at_least`` with p = k·q + 1 prime for some even k ≤ max_k (smallest k)."""
    q = max(3, q_at_least)
    while 2 * q + 1 < 2**31:
        if is_prime(q):
            for k in range(2, max_k + 1, 2):
                p = k * q + 1
                if p >= 2**31:
                    break
                if is_prime(p):
                    return Field(p, q, _subgroup_generator(p, q))
        q += 1
    raise ValueError(f"no field with q >= {q_at_least}, p = k·q + 1 < 2^31, k <= {max_k}")


@functools.lru_cache(maxsize=None)
def default_field() -> Field:
    """The verifier's default: a safe prime p = 2q + 1 just below 2^31 (found once, deterministically)."""
    return make_field(2**30 - 2**18, max_k=2)


def small_field(p: int, q: int) -> Field:
    """A tiny field (e.g. p=11, q=5) for measuring miss rates against the stated bound."""
    return Field(p, q, _subgroup_generator(p, q))
