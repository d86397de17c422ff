"""The subexpression oracle: may a partial computation still be part of the target expression?

``SubexprOracle(store, targets).query(e)`` answers whether the normal form ``e`` occurs inside one
of the target normal forms, up to the axioms the normal form builds in (``nf`` docstring) plus
the ones that only make sense for *partial* values:

* a product is part of a product if its factors are a sub-multiset (commutativity, associativity);
  factors inside a sum count as the sum's factors because independent factors move in and out;
* a sum over some parts of an index is part of a sum over more parts of it (split sums);
* a sum of terms is part of an expression if its terms map to distinct terms there with one
  common cofactor and one coefficient ratio (distributivity: (a+b)·c = a·c + b·c);
* coefficients may differ from the target's by a scale the graph can still apply: one program
  constant or its reciprocal;
* a constant is part of the target if its value appears there as a coefficient (or is ±1).

The oracle
over-approximates: it never rejects a value that a correct μGraph could compute, but it lets some
wrong ones through; the verifier has the last word. Answers are memoised per store; the oracle
counts queries, hits and the time they took.
"""
from __future__ import annotations

import time
from fractions import Fraction

from .nf import ALL, NFStore


class SubexprOracle:
    def __init__(self, store: NFStore, targets: list[int], scales: tuple = (), known: tuple = ()):
        """``scales``: the program's constants; a part may differ from its target by one of them
        (or its reciprocal): the scale a μGraph can still apply. ``known``: normal forms accepted
        as they are (the program's own values: a mean subtraction (x − Σx/n)² merges terms only
        after its sum, Σ_i c = n·c, which no rule below can foresee)."""
        self.s = store
        self.known = frozenset(known)
        self.scales = {Fraction(1)} | {abs(Fraction(c)) for c in scales if c} | {1 / abs(Fraction(c)) for c in scales if c}
        self.exprs: list[int] = []
        self.coeffs: set[Fraction] = set()
        seen: set[int] = set()
        for t in targets:
            self._collect_expr(t, seen)
        self._flat: dict[int, tuple[dict, list]] = {}  # mono -> (leaves, sums), see _flatten
        self._memo: dict[int, bool] = {}
        self._parts: dict[tuple[int, int, bool], bool] = {}
        self.terms = sorted({t for x in self.exprs for t in self.s.terms(x)})
        self.queries = 0
        self.hits = 0
        self.seconds = 0.0

    # ------------------------------------------------------------ pool of sub-objects of the targets
    def _collect_expr(self, e: int, seen: set[int]) -> None:
        if e in seen:
            return
        seen.add(e)
        self.exprs.append(e)
        for m, c in self.s.terms(e):
            self.coeffs.add(abs(c))
            self._collect_mono(m, seen)

    def _collect_mono(self, m: int, seen: set[int]) -> None:
        if m in seen:
            return
        seen.add(m)
        for f, _ in self.s.mono_items(m):
            k = self.s.fkey(f)
            if k[0] in ("fn", "inv"):
                self._collect_expr(k[-1], seen)
            elif k[0] == "sum":
                self._collect_mono(k[2], seen)

    def _flatten(self, m: int) -> tuple[dict[int, int], list[tuple[dict[int, set[str]], dict[int, int]]]]:
        """Leaf factors with exponents (looking through sum factors), and every sum factor inside
        the mono, nested ones included, as (bound parts per index, its leaves)."""
        got = self._flat.get(m)
        if got is None:
            leaves: dict[int, int] = {}
            sums: list = []
            self._flatten_into(m, leaves, sums)
            got = self._flat[m] = (leaves, sums)
        return got

    def _flatten_into(self, m: int, leaves: dict, sums: list) -> None:
        for f, e in self.s.mono_items(m):
            k = self.s.fkey(f)
            if k[0] == "sum" and e == 1:
                inner: dict[int, int] = {}
                self._flatten_into(k[2], inner, sums)
                binds = {idx: ({ALL} if parts == ALL else set(parts)) for idx, parts in k[1]}
                sums.append((binds, inner))
                for g, x in inner.items():
                    leaves[g] = leaves.get(g, 0) + x
            else:
                # numerator and denominator leaves are kept apart (x⁻¹·Σ x² is not x·Σ x)
                key = (f, e > 0)
                leaves[key] = leaves.get(key, 0) + abs(e)

    @staticmethod
    def _leaves_in(le: dict, lt: dict) -> bool:
        return all(lt.get(f, 0) >= e for f, e in le.items())

    def _sum_in(self, binds: dict, leaves: dict, tb: dict, tl: dict) -> bool:
        """A (partial) sum is part of a target sum: fewer parts bound, fewer leaves, and every
        target leaf that depends on a bound index already inside (it cannot join after the sum)."""
        for idx, parts in binds.items():
            pt = tb.get(idx)
            if pt is None or not (ALL in pt or parts <= pt):
                return False
            for f, x in tl.items():
                if idx in self.s.free(f[0]) and leaves.get(f, 0) != x:
                    return False
        return self._leaves_in(leaves, tl)

    def _part(self, me: int, mt: int, flip: bool) -> bool:
        key = (me, mt, flip)
        got = self._parts.get(key)
        if got is None:
            got = self._parts[key] = self._mono_part(me, mt, flip) is not None
        return got

    def _mono_part(self, me: int, mt: int, flip: bool = False) -> tuple | None:
        """The cofactor leaves (target minus part) if ``me`` (inverted when ``flip``: a value that
        will divide) is part of ``mt``, else None. A factor of the part matches a whole target
        factor of the same sign, or a sum factor matches a sum inside the target."""
        lt, st = self._flatten(mt)
        rest = dict(lt)
        for f, e in self.s.mono_items(me):
            e = -e if flip else e
            k = self.s.fkey(f)
            if rest.get((f, e > 0), 0) >= abs(e):
                rest[(f, e > 0)] -= abs(e)
                continue
            if k[0] == "cnt":  # a count of part of an index: a scale the rest of the sum completes
                continue
            if k[0] != "sum":
                return None
            le, se = self._flatten(self.s.mono({f: 1}))
            binds, leaves = se[-1]  # the outer sum: nested ones are appended first
            g = self._whole_sum(binds, leaves, rest, e)
            if g is not None:  # a partial sum of a target sum that is a whole factor (a divisor)
                rest[g] -= abs(e)
                continue
            if e != 1:
                return None
            if not self._leaves_in(le, rest) or not any(self._sum_in(binds, leaves, tb, tl) for tb, tl in st):
                return None
            for x, n in le.items():
                rest[x] -= n
        return frozenset((x, n) for x, n in rest.items() if n), self._missing(me, mt)

    def _binds(self, m: int) -> dict[int, set]:
        out: dict[int, set] = {}
        for binds, _ in self._flatten(m)[1]:
            for idx, parts in binds.items():
                full = self.s.nontrivial.get(idx, frozenset("t"))
                out.setdefault(idx, set()).update(full if ALL in parts else parts)
        return out

    def _missing(self, me: int, mt: int) -> frozenset:
        """Parts of indices the target sums that the part has not summed yet (the later sums)."""
        be, bt = self._binds(me), self._binds(mt)
        return frozenset((i, frozenset(p - be.get(i, set()))) for i, p in bt.items() if p - be.get(i, set()))

    def _whole_sum(self, binds: dict, leaves: dict, rest: dict, e: int):
        for (g, sign), n in rest.items():
            if sign == (e > 0) and n >= abs(e) and self.s.fkey(g)[0] == "sum":
                _, tse = self._flatten(self.s.mono({g: 1}))
                if self._sum_in(binds, leaves, *tse[-1]):
                    return (g, sign)
        return None

    def _ratio_ok(self, r: Fraction) -> bool:
        return abs(r) in self.scales

    # ------------------------------------------------------------ the query
    def query(self, e: int) -> bool:
        self.queries += 1
        got = self._memo.get(e)
        if got is not None:
            self.hits += 1
            return got
        t0 = time.perf_counter()
        got = self._memo[e] = e in self.known or self._decide(e)
        self.seconds += time.perf_counter() - t0
        return got

    def _decide(self, e: int) -> bool:
        terms = [(m, c) for m, c in self.s.terms(e)]
        if not terms:
            return False
        if all(m == self.s.ONE_MONO for m, _ in terms):
            return all(abs(c) in self.coeffs or abs(c) == 1 for _, c in terms)
        if len(terms) == 1:
            (m, c), = terms
            # A part with only positive exponents may also be a divisor-to-be (matched inverted).
            divisor = all(e > 0 for _, e in self.s.mono_items(m))
            return any(self._part(m, mt, False) and self._ratio_ok(ct / c)
                       or divisor and self._part(m, mt, True) and self._ratio_ok(ct * c)
                       for mt, ct in self.terms)
        return any(self._terms_fit(terms, x) for x in self.exprs if len(self.s.terms(x)) >= len(terms))

    def _terms_fit(self, terms: list[tuple[int, Fraction]], x: int) -> bool:
        """Every term maps to a distinct term of ``x`` with one common cofactor and ratio."""
        xt = list(self.s.terms(x))
        (m0, c0), rest = terms[0], terms[1:]
        for i, (mt, ct) in enumerate(xt):
            cof = self._mono_part(m0, mt)
            if cof is None:
                continue
            ratio, used, ok = ct / c0, {i}, self._ratio_ok(ct / c0)
            for m, c in rest:
                j = next((j for j, (mt2, ct2) in enumerate(xt) if j not in used and ct2 / c == ratio
                          and self._mono_part(m, mt2) == cof), None)
                if j is None:
                    ok = False
                    break
                used.add(j)
            if ok:
                return True
        return False
