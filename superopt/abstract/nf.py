"""Abstract expressions in a normal form: interned sums of products with reduction indices.

An abstract expression says *what* a tensor element is, as a function of input elements, up to the
axioms of ``axioms.AXIOMS``; it forgets *how* it is computed (tiling, order of operations). Two
computations with the same normal form are equal under those axioms, so equality and subexpression
tests are integer comparisons instead of e-graph saturation (Mirage §4.3 uses Z3 for this).

Normal form (all parts interned to small ints in an ``NFStore``):

* an *expr* is a sum of terms ``coeff · mono`` (coeff a ``Fraction``; like terms merged; 0 dropped);
* a *mono* is a multiset of factors with non-zero integer exponents;
* a *factor* is one of
  ``("in", name, labels)``  an input element; labels are the program's index ids of its dims;
  ``("fn", op, expr)``      an opaque function (rsqrt, silu, …) or ``exp`` of a single term;
  ``("inv", expr)``         1 / a sum of two or more terms;
  ``("sum", binds, mono)``  Σ over bound indices of a mono that depends on every bound index;
  ``("cnt", index, parts)``  the number of elements in some parts of an index (a sum of a term
                            that does not depend on the summed index: Σ_i c = n·c). A whole
                            index of known extent (``sizes``) is the number n itself.

Reduction indices are the program's own index ids (``abstract.program``), so ``Σ_k x[b,k]·w[k,n]``
knows which dims meet. A bound index carries the *parts* that are summed: a tiled dim is split
into a grid part ``g``, a for-loop part ``l`` and a tile part ``t`` (``ir.graph``); summing over
the tile dim binds ``t``, an accumulator binds ``l``, a cross-block reduction binds ``g``. Once
every part with extent > 1 is bound the binding becomes ``*``, the whole index — this is the
split-sum axiom Σ_k = Σ_tiles Σ_in-tile as a rule of the normal form.

Canonical choices: products are expanded over sums (distributivity); a factor that does not
depend on a sum's bound indices is pulled out of it ((a·c)/b = (a/b)·c, rms-division after the
matmul); nested sums over disjoint indices merge (associativity of Σ); ``exp`` of a sum is a
product of ``exp`` of its terms. Division by a single term inverts its exponents.
"""
from __future__ import annotations

from fractions import Fraction

ALL = "*"  # a binding of every part of an index


class NotNormalizable(ValueError):
    """The value is outside what the abstract domain models (it is pruned, with this reason)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class NFStore:
    """Interns factors, monos and exprs; memoises every operation on them.

    ``nontrivial[i]`` is the set of parts of index ``i`` with extent > 1 under the tiling being
    searched; an index not listed is untiled (only its tile part ``t`` exists).
    """

    def __init__(self, nontrivial: dict[int, frozenset] | None = None, sizes: dict[int, int] | None = None):
        self.nontrivial = dict(nontrivial or {})
        self.sizes = dict(sizes or {})  # index id -> extent, for Σ_i c = n·c
        self._ids: dict[tuple, int] = {}
        self.keys: list[tuple] = []          # id -> ("f", key) | ("m", key) | ("e", key)
        self._free: dict[int, frozenset] = {}
        self._memo: dict[tuple, int] = {}
        self.ONE_MONO = self._intern(("m", ()))
        self.ONE = self.expr({self.ONE_MONO: Fraction(1)})
        self.ZERO = self.expr({})

    # ------------------------------------------------------------ interning
    def _intern(self, key: tuple) -> int:
        i = self._ids.get(key)
        if i is None:
            i = len(self.keys)
            self._ids[key] = i
            self.keys.append(key)
        return i

    def factor(self, key: tuple) -> int:
        return self._intern(("f",) + key)

    def mono(self, exps: dict[int, int]) -> int:
        return self._intern(("m", tuple(sorted((f, e) for f, e in exps.items() if e))))

    def expr(self, terms: dict[int, Fraction]) -> int:
        return self._intern(("e", tuple(sorted((m, c) for m, c in terms.items() if c))))

    def fkey(self, f: int) -> tuple:
        return self.keys[f][1:]

    def mono_items(self, m: int) -> tuple[tuple[int, int], ...]:
        return self.keys[m][1]

    def terms(self, e: int) -> tuple[tuple[int, Fraction], ...]:
        return self.keys[e][1]

    # ------------------------------------------------------------ free indices
    def free(self, i: int) -> frozenset:
        got = self._free.get(i)
        if got is not None:
            return got
        kind, key = self.keys[i][0], self.keys[i][1:]
        if kind == "m":
            out = frozenset().union(*(self.free(f) for f, _ in key[0])) if key[0] else frozenset()
        elif kind == "e":
            out = frozenset().union(*(self.free(m) for m, _ in key[0])) if key[0] else frozenset()
        elif key[0] == "in":
            out = frozenset(x for x in key[2] if x >= 0)
        elif key[0] in ("fn", "inv"):
            out = self.free(key[-1])
        elif key[0] == "cnt":
            out = frozenset()
        else:  # sum
            out = self.free(key[2]) - {idx for idx, parts in key[1] if parts == ALL}
        self._free[i] = out
        return out

    # ------------------------------------------------------------ constructors
    def atom(self, name: str, labels: tuple[int, ...]) -> int:
        f = self.factor(("in", name, tuple(labels)))
        return self.expr({self.mono({f: 1}): Fraction(1)})

    def const(self, value: float) -> int:
        return self.expr({self.ONE_MONO: Fraction(value)})

    def add(self, a: int, b: int, sign: int = 1) -> int:
        key = ("add", a, b, sign)
        if key not in self._memo:
            acc = dict(self.terms(a))
            for m, c in self.terms(b):
                acc[m] = acc.get(m, Fraction(0)) + sign * c
            self._memo[key] = self.expr(acc)
        return self._memo[key]

    def scale(self, a: int, c: Fraction) -> int:
        return self.expr({m: c * x for m, x in self.terms(a)})

    def _mono_mul(self, m1: int, m2: int) -> int:
        acc = dict(self.mono_items(m1))
        for f, e in self.mono_items(m2):
            acc[f] = acc.get(f, 0) + e
        return self.mono(acc)

    def mul(self, a: int, b: int) -> int:
        key = ("mul",) + ((a, b) if a <= b else (b, a))
        if key not in self._memo:
            acc: dict[int, Fraction] = {}
            for m1, c1 in self.terms(a):
                for m2, c2 in self.terms(b):
                    m = self._mono_mul(m1, m2)
                    acc[m] = acc.get(m, Fraction(0)) + c1 * c2
            self._memo[key] = self.expr(acc)
        return self._memo[key]

    def inv(self, a: int) -> int:
        key = ("inv", a)
        if key not in self._memo:
            ts = self.terms(a)
            if not ts:
                raise NotNormalizable("division by zero")
            if len(ts) == 1:
                (m, c), = ts
                self._memo[key] = self.expr({self.mono({f: -e for f, e in self.mono_items(m)}): 1 / c})
            else:
                self._memo[key] = self.expr({self.mono({self.factor(("inv", a)): 1}): Fraction(1)})
        return self._memo[key]

    def div(self, a: int, b: int) -> int:
        return self.mul(a, self.inv(b))

    def fn(self, op: str, a: int) -> int:
        """An opaque unary function; ``exp`` splits over the terms of its argument."""
        key = ("fn", op, a)
        if key not in self._memo:
            if op == "exp":
                out = self.ONE
                for m, c in self.terms(a):
                    f = self.factor(("fn", "exp", self.expr({m: c})))
                    out = self.mul(out, self.expr({self.mono({f: 1}): Fraction(1)}))
            else:
                out = self.expr({self.mono({self.factor(("fn", op, a)): 1}): Fraction(1)})
            self._memo[key] = out
        return self._memo[key]

    # ------------------------------------------------------------ reductions
    def _norm_binds(self, binds: dict[int, str]) -> tuple[tuple[int, str], ...]:
        out = []
        for idx, parts in sorted(binds.items()):
            if parts != ALL and set(parts) >= self.nontrivial.get(idx, frozenset("t")):
                parts = ALL
            out.append((idx, parts))
        return tuple(out)

    @staticmethod
    def _merge_parts(p: str, q: str) -> str:
        if ALL in (p, q):
            return ALL
        return "".join(sorted(set(p) | set(q)))

    def reduce(self, a: int, binds: tuple[tuple[int, str], ...]) -> int:
        """Σ over ``binds`` ((index, parts) pairs) of every term of ``a``."""
        key = ("reduce", a, binds)
        if key not in self._memo:
            acc: dict[int, Fraction] = {}
            for m, c in self.terms(a):
                mm, k = self._sum_mono(m, dict(binds))
                acc[mm] = acc.get(mm, Fraction(0)) + c * k
            self._memo[key] = self.expr(acc)
        return self._memo[key]

    def _count(self, indep: dict[int, int], binds: dict[int, str]) -> tuple[int, Fraction]:
        """Σ over ``binds`` of a mono free of them: the mono times the number of summed elements.
        Parts of one index merge with a count of its other parts already in the mono (a tile sum,
        then the loop over tiles); a whole index of known extent becomes that number."""
        k = Fraction(1)
        for idx, parts in sorted(binds.items()):
            for f, e in list(indep.items()):
                fk = self.fkey(f)
                if fk[0] == "cnt" and fk[1] == idx and e == 1 and ALL not in (parts, fk[2]) \
                        and not set(parts) & set(fk[2]):
                    del indep[f]
                    parts = self._merge_parts(parts, fk[2])
            parts = self._norm_binds({idx: parts})[0][1]
            if parts == ALL and idx in self.sizes:
                k *= self.sizes[idx]
            else:
                f = self.factor(("cnt", idx, parts))
                indep[f] = indep.get(f, 0) + 1
        return self.mono(indep), k

    def _sum_mono(self, m: int, binds: dict[int, str]) -> tuple[int, Fraction]:
        bound = set(binds)
        dep, indep = {}, {}
        for f, e in self.mono_items(m):
            (dep if self.free(f) & bound else indep)[f] = e
        if not dep:
            return self._count(indep, binds)
        binds = dict(binds)
        # Merge nested sums: a lone sum factor (same or other indices), or sums over indices that no
        # other dependent factor mentions (Σ_r b_r·Σ_k x_k a_kr = Σ_{r,k} b_r x_k a_kr).
        changed = True
        while changed:
            changed = False
            for f, e in list(dep.items()):
                k = self.fkey(f)
                if k[0] != "sum" or e != 1:
                    continue
                inner = {i for i, _ in k[1]}
                others = frozenset().union(*(self.free(g) for g in dep if g != f)) if len(dep) > 1 else frozenset()
                if len(dep) > 1 and (inner & others or inner & bound):
                    continue
                del dep[f]
                for i, p in k[1]:
                    binds[i] = self._merge_parts(binds.get(i, ""), p) if i in binds else p
                for g, x in self.mono_items(k[2]):
                    dep[g] = dep.get(g, 0) + x
                changed = True
                break
        s = self.factor(("sum", self._norm_binds(binds), self.mono(dep)))
        indep[s] = indep.get(s, 0) + 1
        return self.mono(indep), Fraction(1)

    # ------------------------------------------------------------ substitution
    def substitute(self, e: int, table: dict[int, int]) -> int:
        """Replace factors (ids in ``table``) by exprs, rebuilding the normal form around them."""
        key = ("subst", e, tuple(sorted(table.items())))
        if key in self._memo:
            return self._memo[key]
        out = self.ZERO
        for m, c in self.terms(e):
            t = self.const(c)
            for f, x in self.mono_items(m):
                fe = self._subst_factor(f, table)
                p = fe if x > 0 else self.inv(fe)
                for _ in range(abs(x)):
                    t = self.mul(t, p)
            out = self.add(out, t)
        self._memo[key] = out
        return out

    def _subst_factor(self, f: int, table: dict[int, int]) -> int:
        if f in table:
            return table[f]
        k = self.fkey(f)
        if k[0] in ("in", "cnt"):
            return self.expr({self.mono({f: 1}): Fraction(1)})
        if k[0] == "fn":
            return self.fn(k[1], self.substitute(k[2], table))
        if k[0] == "inv":
            return self.inv(self.substitute(k[1], table))
        body = self.substitute(self.expr({k[2]: Fraction(1)}), table)
        return self.reduce(body, k[1])

    # ------------------------------------------------------------ display
    def show(self, e: int) -> str:
        parts = []
        for m, c in self.terms(e):
            fs = [self._show_f(f) + (f"^{x}" if x != 1 else "") for f, x in self.mono_items(m)]
            parts.append("·".join(([str(c)] if c != 1 or not fs else []) + fs))
        return " + ".join(parts) if parts else "0"

    def _show_f(self, f: int) -> str:
        k = self.fkey(f)
        if k[0] == "in":
            return f"{k[1]}[{','.join(map(str, k[2]))}]"
        if k[0] == "fn":
            return f"{k[1]}({self.show(k[2])})"
        if k[0] == "inv":
            return f"inv({self.show(k[1])})"
        if k[0] == "cnt":
            return f"#[{k[1]}:{k[2]}]"
        binds = ",".join(f"{i}:{p}" for i, p in k[1])
        return f"Σ[{binds}]({self.show(self.expr({k[2]: Fraction(1)}))})"
