"""Block-level search: bottom-up enumeration of the values one threadblock can compute, pruned.

For one tiling pattern, the search starts from the input tiles and the program's constants and
applies every op of the program's vocabulary (plus ``accum_sum`` when there is a for-loop) to the
values found so far, round by round (semi-naive: each round combines at least one new value).
A new value survives only if

1. its operands' loop variance may meet (``ir.check`` rules)          — pruned "variance";
2. its shape type-checks                                              — pruned "shape";
3. the dims it lines up carry the same program index                  — pruned "index"
   (operand pairs whose label classes cannot line up are skipped in bulk: "index_bulk");
4. the abstract domain models it                                       — pruned "not_modelled";
5. no earlier value has the same normal form, labels, variance, dtype  — pruned "duplicate";
   constants are folded first: no a+a, no (a·c1)·c2                    — pruned "canonical";
   no constant is recomputed from input data (x/x)                     — pruned "constant";
6. its normal form is a subexpression of the kernel's targets (oracle) — pruned "abstract";
7. its derivation fits ``max_block_ops``                               — pruned "size";
8. for a program whose softmax subtracts a max, an exp applies to one of the program's exp
   operands, whole (not exp(a)·exp(b) for exp(a + b)), so the max can be kept — pruned "exp_arg".
9. it is not computed narrower than the program computes it           — pruned "precision"
   (``search.precision``: HF's fp32 upcasts stay fp32).

Rule 5 is the canonical order: a block graph is enumerated once per abstract value, through its
first (smallest-round) derivation. The search stops when every target has a value with exactly
the target's normal form and dim labels (after the cross-block sum, for split kernels), or when
no new value appears, or at the state cap or the clock. A state is one attempted op application.
Before the first round the program's own dataflow is replayed on the tiles (``run(guide=…)``):
where the tiling lets every op run as written that is the direct fusion, found in a few states;
the rounds then find what needs reordering (division after a matmul, accumulate-then-divide).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..abstract import NFStore, NotNormalizable, SubexprOracle, apply_abstract
from ..abstract.movement import MOVED_OPS, block_labels
from ..ir import TensorType, infer_type, input_tile_shape
from ..ir.shapes import ShapeError
from .replay import replay
from .skeleton import KernelSkeleton, Pattern

PRE, LOOP, POST = "pre", "loop", "post"
COMMUTATIVE = {"add", "mul"}


@dataclass(frozen=True)
class Source:
    """A device tensor a kernel may read: a program input or an earlier kernel's output."""

    name: str
    labels: tuple[int, ...]
    type: TensorType


@dataclass
class Val:
    expr: int
    labels: tuple[int, ...]
    type: TensorType
    var: str
    op: str
    args: tuple
    attrs: tuple
    nodes: frozenset


@dataclass(frozen=True)
class Goal:
    expr: int
    labels: tuple[int, ...] | None   # None: any labels (split-kernel outputs)
    name: str
    dtype: str | None = None         # None: any dtype


def tiling(pattern: Pattern, src: Source) -> tuple[tuple[int, int, int], int]:
    """imap and fmap of a source under a pattern: each axis partitions the dim of its index."""
    imap = [-1, -1, -1]
    for a, idx in enumerate(pattern.grid):
        imap[a] = src.labels.index(idx) if idx in src.labels else -1
    fmap = src.labels.index(pattern.loop) if pattern.loop >= 0 and pattern.loop in src.labels else -1
    return (imap[0], imap[1], imap[2]), fmap


class BlockSearch:
    def __init__(self, store: NFStore, oracle: SubexprOracle | None, sources: list[Source],
                 pattern: Pattern, grid: tuple[int, int, int], forloop: int, vocab: dict,
                 consts: tuple, max_ops: int, cap: int, deadline: float = float("inf"),
                 exp_args: frozenset | None = None, precision=None):
        self.s, self.oracle, self.pattern = store, oracle, pattern
        self.exp_args = exp_args
        self.precision = precision  # search.precision.PrecisionFloor, or None: dtypes unconstrained
        self._replaying = False
        self.sources, self.vocab, self.max_ops, self.cap = sources, vocab, max_ops, cap
        self.deadline = deadline
        self._tiled = set(pattern.grid) | ({pattern.loop} if pattern.loop >= 0 else set())
        self.vals: list[Val] = []
        self.seen: dict[tuple, int] = {}   # (normal form, labels, variance, dtype) -> value id
        self.last_duplicate: int | None = None  # the value an application was a duplicate of
        self.pruned: dict[str, int] = {}
        self.states = 0
        self.cap_hit = False
        for pos, src in enumerate(sources):
            imap, fmap = tiling(pattern, src)
            tile = input_tile_shape(src.type.shape, grid, imap, fmap, forloop)
            self._add(Val(store.atom(src.name, src.labels), src.labels, TensorType(tile, src.type.dtype),
                          LOOP if fmap != -1 else PRE, "input", (pos, imap, fmap), (), frozenset()))
        for i, (value, dtype) in enumerate(consts):
            if (store.const(value), (), PRE, dtype) in self.seen:
                continue  # the same constant twice (two RMSNorms' eps)
            self._add(Val(store.const(value), (), TensorType((), dtype), PRE, "const", (),
                          (("index", i),), frozenset()))

    def _add(self, v: Val) -> None:
        v.nodes = v.nodes | {len(self.vals)}
        self.seen[(v.expr, v.labels, v.var, v.type.dtype)] = len(self.vals)
        self.vals.append(v)

    def _prune(self, reason: str) -> None:
        self.pruned[reason] = self.pruned.get(reason, 0) + 1

    # ------------------------------------------------------------ one op application
    def _try(self, op: str, args: tuple[int, ...], attrs: tuple) -> None:
        self.states += 1
        vs = [self.vals[a] for a in args]
        if not self._replaying and self._folds(op, args, vs):
            return self._prune("canonical")  # the replay keeps the program's own order: (s·scale)/softcap
        vars_ = {v.var for v in vs}
        if op == "accum_sum":
            if vs[0].var != LOOP:
                return self._prune("variance")
            var = POST
        elif LOOP in vars_ and POST in vars_:
            return self._prune("variance")
        else:
            var = LOOP if LOOP in vars_ else POST if POST in vars_ else PRE
        if op == "exp" and self.exp_args is not None and vs[0].expr not in self.exp_args:
            return self._prune("exp_arg")
        try:
            t = infer_type(op, [v.type for v in vs], attrs)
        except ShapeError:
            return self._prune("shape")
        if op in MOVED_OPS:
            labels = block_labels(getattr(self.s, "movement", {}), self._tiled, op, [v.labels for v in vs],
                                  dict(attrs))
        else:
            labels = self._labels(op, vs, dict(attrs), len(t.shape))
        if labels is None:
            return self._prune("index")
        try:
            if op == "accum_sum":
                expr = self.s.reduce(vs[0].expr, ((self.pattern.loop, "l"),))
            else:
                expr = apply_abstract(self.s, op, [v.expr for v in vs], dict(attrs),
                                      [v.labels for v in vs], labels, parts="t")
        except NotNormalizable:
            return self._prune("not_modelled")
        if self._constant(expr) and not all(self._constant(v.expr) for v in vs):
            return self._prune("constant")  # a constant recomputed from input data (x/x)
        if self.precision is not None and self.precision.too_narrow(op, expr, t.dtype, [v.type.dtype for v in vs]):
            return self._prune("precision")  # arithmetic the program does wide, done narrow
        key = (expr, labels, var, t.dtype)  # casts change no value but do change the dtype
        if key in self.seen:
            self.last_duplicate = self.seen[key]
            return self._prune("duplicate")
        # an exp operand of the program is kept whole (rule 8); its normal form, a sum, is inside
        # the targets only as a product of exps, which the oracle cannot see
        wanted = self.exp_args is not None and expr in self.exp_args
        if self.oracle is not None and not wanted and not self.oracle.query(expr):
            return self._prune("abstract")
        nodes = frozenset().union(*(v.nodes for v in vs))
        if len(nodes - self._leaves) + 1 > self.max_ops:
            return self._prune("size")
        self._add(Val(expr, labels, t, var, op, args, attrs, nodes))

    def _folds(self, op: str, args: tuple, vs: list[Val]) -> bool:
        """Canonical order for constants: a+a is 2·a, and (a·c1)·c2 is a·(c1·c2) with the constants
        combined first, so a value is scaled by a constant at most once in a row."""
        if op in ("add", "sub") and args[0] == args[1]:
            return True
        if op not in ("mul", "div"):
            return False
        consts = [self._constant(v.expr) for v in vs]
        if consts[0] == consts[1]:
            return False
        other = vs[1] if consts[0] else vs[0]
        return other.op in ("mul", "div") and any(self._constant(self.vals[a].expr) for a in other.args)

    def _constant(self, expr: int) -> bool:
        return all(m == self.s.ONE_MONO for m, _ in self.s.terms(expr))

    @staticmethod
    def _labels(op: str, vs: list[Val], attrs: dict, rank: int) -> tuple[int, ...] | None:
        if op in ("accum_sum",) or len(vs) == 1 and op not in ("reduce_sum", "transpose"):
            return vs[0].labels
        if op == "reduce_sum":
            lab = list(vs[0].labels)
            d = attrs["dim"]
            if lab[d] < 0:
                return None
            if attrs["keepdim"]:
                lab[d] = -1
            else:
                del lab[d]
            return tuple(lab)
        if op == "transpose":
            lab = list(vs[0].labels)
            lab[-1], lab[-2] = lab[-2], lab[-1]
            return tuple(lab)
        a, b = vs[0].labels, vs[1].labels
        if op == "matmul":
            if a[-1] != b[-2]:
                return None
            batch = _broadcast_labels(a[:-2], b[:-2])
            return None if batch is None else batch + (a[-2], b[-1])
        return _broadcast_labels(a, b)

    # ------------------------------------------------------------ rounds
    def run(self, goals: list[Goal], split: int = -1, guide=None) -> dict[str, int] | None:
        """Search until every goal has a value; return goal name -> value id, or None.

        ``guide`` (the program and the normal forms of its values) first replays the program's
        own dataflow on the tiles — the direct fusion, found in a few states when the tiling lets
        every op run as written — before the rounds explore reorderings."""
        self._leaves = frozenset(i for i, v in enumerate(self.vals) if v.op in ("input", "const"))
        found: dict[str, int] = {}
        new = list(range(len(self.vals)))
        if guide is not None:
            self._replay(*guide)
            new = list(range(len(self.vals)))
        self._match(goals, new, found, split)
        while new and len(found) < len(goals):
            start = len(self.vals)
            if not self._round(set(new)):
                self.cap_hit = True
                break
            new = list(range(start, len(self.vals)))
            self._match(goals, new, found, split)
        return found if len(found) == len(goals) else None

    def _replay(self, program, env: dict[str, int], labels: dict[str, tuple]) -> None:
        replay(self, program, env, labels)

    def _round(self, new: set[int]) -> bool:
        n = len(self.vals)
        for op in self.vocab["unary"]:
            for i in sorted(new):
                if not self._ok():
                    return False
                self._try(op, (i,), ())
        for keep in self.vocab["reduce"]:
            for i in sorted(new):
                for d in range(self.vals[i].type.rank):
                    if not self._ok():
                        return False
                    self._try("reduce_sum", (i,), (("dim", d), ("keepdim", keep)))
        for dtype in self.vocab["cast"]:
            for i in sorted(new):
                if self.vals[i].type.dtype != dtype:
                    self._try("cast", (i,), (("dtype", dtype),))
        if self.vocab["transpose"]:
            for i in sorted(new):
                if self.vals[i].type.rank >= 2:
                    self._try("transpose", (i,), ())
        if self.pattern.loop >= 0:
            for i in sorted(new):
                if not self._ok():
                    return False
                self._try("accum_sum", (i,), ())
        compatible = self._compatible_pairs(n, new)
        for op in self.vocab["binary"]:
            for i, j in compatible[op == "matmul"]:
                if op in COMMUTATIVE and j < i:
                    continue
                if not self._ok():
                    return False
                self._try(op, (i, j), ())
        return True

    def _compatible_pairs(self, n: int, new: set[int]) -> tuple[list, list]:
        """(elementwise, matmul) operand pairs with at least one new value whose dims line up by
        index; the rest are pruned "index_bulk", by label class, without being tried (nor
        counted as states)."""
        by_label: dict[tuple, list[int]] = {}
        for i in range(n):
            by_label.setdefault(self.vals[i].labels, []).append(i)
        elem, mm = [], []
        for la, xs in by_label.items():
            for lb, ys in by_label.items():
                ok_e = _broadcast_labels(la, lb) is not None
                ok_m = len(la) >= 2 and len(lb) >= 2 and la[-1] == lb[-2] and la[-1] >= 0 \
                    and _broadcast_labels(la[:-2], lb[:-2]) is not None
                pairs = [(i, j) for i in xs for j in ys if i in new or j in new]
                if ok_e:
                    elem += pairs
                if ok_m:
                    mm += pairs
                has_mm = int("matmul" in self.vocab["binary"])
                skipped = len(pairs) * ((0 if ok_e else len(self.vocab["binary"]) - has_mm) + (0 if ok_m else has_mm))
                if skipped:
                    self.pruned["index_bulk"] = self.pruned.get("index_bulk", 0) + skipped
        return sorted(elem), sorted(mm)

    def _ok(self) -> bool:
        if self.states % 1024 == 0 and time.time() > self.deadline:
            self.cap = self.states  # the search's clock ran out: stop like at the state cap
        return self.states < self.cap

    def _match(self, goals: list[Goal], new: list[int], found: dict[str, int], split: int) -> None:
        for i in new:
            v = self.vals[i]
            if v.var == LOOP:
                continue
            expr = v.expr
            if split >= 0:
                try:
                    expr = self.s.reduce(expr, ((split, "g"),))
                except NotNormalizable:
                    continue
            for g in goals:
                if g.name not in found and g.expr == expr and (g.labels is None or g.labels == v.labels) \
                        and (g.dtype is None or g.dtype == v.type.dtype):
                    found[g.name] = i

    # ------------------------------------------------------------ the result
    def skeleton(self, found: dict[str, int], goals: list[Goal], split: int) -> KernelSkeleton:
        used = sorted(frozenset().union(*(self.vals[found[g.name]].nodes for g in goals)))
        srcs = sorted({self.vals[i].args[0] for i in used if self.vals[i].op == "input"})
        ref: dict[int, int] = {}
        inputs = []
        for i in used:
            v = self.vals[i]
            if v.op == "input":
                ref[i] = len(inputs)
                inputs.append((srcs.index(v.args[0]), v.args[1], v.args[2]))
        nodes = []
        for i in used:
            v = self.vals[i]
            if v.op != "input":
                ref[i] = len(inputs) + len(nodes)
                nodes.append((v.op, tuple(ref[a] for a in v.args), v.attrs))
        outputs, out_labels = [], []
        for g in goals:
            v = self.vals[found[g.name]]
            omap = [-1, -1, -1]
            for a, idx in enumerate(self.pattern.grid):
                if idx in v.labels:
                    omap[a] = v.labels.index(idx)
            reduce = "sum" if split >= 0 else "none"
            outputs.append((ref[found[g.name]], tuple(omap), reduce, g.name))
            out_labels.append(v.labels)
        return KernelSkeleton(self.pattern, tuple(self.sources[s].name for s in srcs), tuple(inputs),
                              tuple(nodes), tuple(outputs), tuple(out_labels))


def _broadcast_labels(a: tuple, b: tuple) -> tuple | None:
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else -1
        y = b[-i] if i <= len(b) else -1
        if x != y and x != -1 and y != -1:
            return None
        out.append(x if x != -1 else y)
    return tuple(reversed(out))
