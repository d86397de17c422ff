"""Launch: how one generated kernel is rendered and launched (warps, stages, prefetch, chain, ordered sums).

The profiler times a μGraph at several ``Launch`` values (applied to all its kernels), a build takes
one per kernel name, and a cache entry keeps the winner's. On disk (a cache entry's ``meta.json``)
a launch is the short list entries have always held — ``[num_warps, num_stages]``, then ``1`` for a
prefetch-rendered kernel, then ``1`` for a chained one (``[w, s, prefetch, 1]``), then ``1`` for one whose
cross-block sums are ordered (``[w, s, prefetch, chain, 1]``) — so that every entry written before this class
still reads, and one written now without the later marks reads in an older build.

Where a kernel runs with programmatic dependent launch is not a per-kernel choice: it follows the
device and ``PatchOptions.pdl`` and is rendered into the whole module (``render_triton(pdl=)``).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping


@dataclass(frozen=True, order=True)
class Launch:
    """One kernel's launch variant: ``num_warps`` × ``num_stages`` as Triton takes them; ``prefetch``:
    rendered loading the next iteration's tiles ahead; ``chain``: rendered running its consumer's
    blocks too (``ir.chain``); ``ordered``: its cross-block sums (``reduce sum``) added in a fixed order, so
    the same inputs give the same bits on every launch (``codegen.triton``, "Numerics")."""

    num_warps: int
    num_stages: int
    prefetch: bool = False
    chain: bool = False
    ordered: bool = False

    def __post_init__(self):
        if not (isinstance(self.num_warps, int) and self.num_warps > 0 and self.num_warps & (self.num_warps - 1) == 0):
            raise ValueError(f"Launch.num_warps must be a power of two ≥ 1, got {self.num_warps!r}")
        if not (isinstance(self.num_stages, int) and self.num_stages >= 1):
            raise ValueError(f"Launch.num_stages must be an integer ≥ 1, got {self.num_stages!r}")

    @classmethod
    def of(cls, value: "Launch | tuple | list") -> "Launch":
        """A ``Launch`` from itself or from its stored list form (2 to 5 integers, see the module doc)."""
        if isinstance(value, Launch):
            return value
        v = list(value)
        if not 2 <= len(v) <= 5 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"a stored launch is 2 to 5 integers [warps, stages, prefetch, chain, ordered], "
                             f"got {value!r}")
        return cls(v[0], v[1], *(len(v) > i and bool(v[i]) for i in (2, 3, 4)))

    def stored(self) -> list[int]:
        """The list a cache entry keeps: as short as the variant allows (``of`` reads it back)."""
        marks = [int(self.prefetch), int(self.chain), int(self.ordered)]
        while marks and not marks[-1]:
            marks.pop()
        return [self.num_warps, self.num_stages, *marks]

    @property
    def label(self) -> str:
        """``w<warps>s<stages>``, then ``p`` for prefetch, ``c`` for chain and ``o`` for ordered sums (reports,
        timings)."""
        return (f"w{self.num_warps}s{self.num_stages}" + ("p" if self.prefetch else "") + ("c" if self.chain else "")
                + ("o" if self.ordered else ""))


Launches = Mapping[str, Launch]  # kernel name -> its launch


def read_launches(stored: Mapping | None) -> dict[str, Launch] | None:
    """A cache entry's ``launch`` field (kernel name -> stored list) as ``Launch`` values; None stays None."""
    if stored is None:
        return None
    if not isinstance(stored, Mapping):
        raise ValueError(f"a stored launch table maps kernel names to launches, got {type(stored).__name__}")
    return {str(k): Launch.of(v) for k, v in stored.items()}


def stored_launches(launch: Launches | None) -> dict[str, list[int]]:
    """``launch`` in the form a cache entry keeps (``read_launches`` reads it back)."""
    return {k: Launch.of(v).stored() for k, v in (launch or {}).items()}


def prefetched(launch: Launches | None) -> frozenset[str]:
    """The kernels a launch table renders with prefetched loads (``render_triton(prefetch=)``)."""
    return frozenset(k for k, v in (launch or {}).items() if v.prefetch)


def chained(launch: Launches | None) -> frozenset[str]:
    """The kernels a launch table renders running their consumer (``render_triton(chain=)``)."""
    return frozenset(k for k, v in (launch or {}).items() if v.chain)


def ordered_sums(launch: Launches | None) -> frozenset[str]:
    """The kernels a launch table renders with their cross-block sums in a fixed order (``render_triton(ordered=)``)."""
    return frozenset(k for k, v in (launch or {}).items() if v.ordered)


def unordered(launch: Launches) -> dict[str, Launch]:
    """``launch`` without its ordered-sums marks: the ordering is a build setting (``compile_graph(ordered_sums=)``,
    ``PatchOptions.deterministic``), not part of the launch a profile chooses and a cache stores."""
    return {k: replace(Launch.of(v), ordered=False) for k, v in launch.items()}


def rendering(launch: Launches | None) -> dict[str, frozenset[str]]:
    """``render_triton``'s per-kernel variants a launch table asks for: ``render_triton(g, **rendering(launch))``."""
    return {"prefetch": prefetched(launch), "chain": chained(launch), "ordered": ordered_sums(launch)}
