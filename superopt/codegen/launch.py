"""Launch: how one generated kernel is rendered and launched (warps, stages, prefetch, chain).

The profiler times a μGraph at several ``Launch`` values (applied to all its kernels), a build takes
one per kernel name, and a cache entry keeps the winner's. On disk (a cache entry's ``meta.json``)
a launch is the short list entries have always held — ``[num_warps, num_stages]``, then ``1`` for a
prefetch-rendered kernel, then ``1`` for a chained one (``[w, s, prefetch, 1]``) — so that every
entry written before this class still reads, and one written now reads in an older build.

Where a kernel runs with programmatic dependent launch is not a per-kernel choice: it follows the
device and ``PatchOptions.pdl`` and is rendered into the whole module (``render_triton(pdl=)``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True, order=True)
class Launch:
    """One kernel's launch variant: ``num_warps`` × ``num_stages`` as Triton takes them; ``prefetch``:
    rendered loading the next iteration's tiles ahead; ``chain``: rendered running its consumer's
    blocks too (``ir.chain``)."""

    num_warps: int
    num_stages: int
    prefetch: bool = False
    chain: bool = False

    def __post_init__(self):
        if not (isinstance(self.num_warps, int) and self.num_warps > 0 and self.num_warps & (self.num_warps - 1) == 0):
            raise ValueError(f"Launch.num_warps must be a power of two ≥ 1, got {self.num_warps!r}")
        if not (isinstance(self.num_stages, int) and self.num_stages >= 1):
            raise ValueError(f"Launch.num_stages must be an integer ≥ 1, got {self.num_stages!r}")

    @classmethod
    def of(cls, value: "Launch | tuple | list") -> "Launch":
        """A ``Launch`` from itself or from its stored list form (2 to 4 integers, see the module doc)."""
        if isinstance(value, Launch):
            return value
        v = list(value)
        if not 2 <= len(v) <= 4 or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
            raise ValueError(f"a stored launch is 2 to 4 integers [warps, stages, prefetch, chain], got {value!r}")
        return cls(v[0], v[1], len(v) > 2 and bool(v[2]), len(v) > 3 and bool(v[3]))

    def stored(self) -> list[int]:
        """The list a cache entry keeps: as short as the variant allows (``of`` reads it back)."""
        if self.chain:
            return [self.num_warps, self.num_stages, int(self.prefetch), 1]
        return [self.num_warps, self.num_stages, 1] if self.prefetch else [self.num_warps, self.num_stages]

    @property
    def label(self) -> str:
        """``w<warps>s<stages>``, then ``p`` for prefetch and ``c`` for chain (reports, timings)."""
        return f"w{self.num_warps}s{self.num_stages}" + ("p" if self.prefetch else "") + ("c" if self.chain else "")


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
