"""The search budget (frozen, logged with every result) and the statistics a search reports."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from .cost import CostParams


@dataclass(frozen=True)
class SearchBudget:
    max_seconds: float = 120.0          # wall clock for the whole search; patterns not started by then are skipped
    max_states: int = 2_000_000         # op applications tried, split evenly over the tiling patterns
    workers: int = 1                    # worker processes for the block searches (1: in this process)
    grid_dims: int = 3                  # at most this many grid axes (1-, 2-, 3-D grids)
    block_threads: tuple[int, ...] = (128, 256)
    max_kernels: int = 2                # 1: single fused kernel only; 2: also split kernel + combine kernel
    max_block_ops: int = 24             # nodes in one block graph
    # preferred tile extents of a grid-split dim: multiples of 16 (``tl.dot`` pads to 16), 48 and 96
    # because 6144 columns (Llama-3-8B qkv) fill 132 SMs as 128 blocks only with 48 a block
    tile_sizes: tuple[int, ...] = (16, 32, 48, 64, 96, 128, 256)
    # preferred per-iteration extents of the for-loop dim: a decode GEMV streams its weights in
    # K-slices, and only slices of 512-1024 keep enough bytes in flight (search/cost.py)
    loop_tile_sizes: tuple[int, ...] = (16, 32, 64, 128, 256, 512, 1024)
    abstract_pruning: bool = True       # off only for the ablation: keep every well-typed value
    verify_top: int = 3                 # verify this many best-ranked distinct structures
    full_verify_elements: int = 30_000_000  # re-verify the winner at the real shape below this many input elements
    cost_params: CostParams | None = None  # the cost model's constants fitted to GPU timings (None: defaults)
    keep_precision: bool = True         # off only for the precision ablation: neither the search rule
                                        # (search.precision), the replay's dtype matching (search.replay)
                                        # nor the dtype check (verify.precision)

    def log(self) -> dict:
        return asdict(self)


@dataclass
class SearchStats:
    patterns: int = 0                   # tiling patterns (grid indices, loop index, split) enumerated
    searches: int = 0                   # distinct block searches: patterns that differ only in
                                        # grid-tiled output indices share one (``skeleton.search_key``)
    patterns_searched: int = 0          # searches run now (the others came from the checkpoint)
    patterns_found: int = 0             # patterns whose block search reached every target
    patterns_resumed: int = 0           # taken from the checkpoint instead of searched
    patterns_skipped_time: int = 0
    states: int = 0                     # op applications tried (partial block graphs extended by one op)
    values_kept: int = 0                # distinct abstract values that survived
    pruned: dict = field(default_factory=dict)   # reason -> count
    oracle_queries: int = 0
    oracle_hits: int = 0                # memoised answers
    oracle_seconds: float = 0.0
    instances: int = 0                  # (pattern, grid extents, loop extent, threads) ranked by the cost model
    verified: int = 0
    rejected: int = 0
    verify_notes: list = field(default_factory=list)  # where and how each verdict was reached
    seconds: dict = field(default_factory=dict)  # phase -> wall seconds
    time_budget_hit: bool = False
    state_budget_hit: int = 0           # patterns that ran out of states
    fallback_reasons: list = field(default_factory=list)  # why a stage (or a pattern) left the space

    def add_pruned(self, other: dict) -> None:
        for k, v in other.items():
            self.pruned[k] = self.pruned.get(k, 0) + v

    @property
    def prune_rate(self) -> float:
        """Rejected / considered extensions (tried states plus pairs skipped by index class)."""
        considered = self.states + self.pruned.get("index_bulk", 0)
        return sum(self.pruned.values()) / considered if considered else 0.0

    @property
    def seconds_per_query(self) -> float:
        return self.oracle_seconds / max(1, self.oracle_queries - self.oracle_hits)

    def summary(self) -> dict:
        d = asdict(self)
        d["prune_rate"] = round(self.prune_rate, 4)
        d["seconds_per_oracle_query"] = self.seconds_per_query
        return d
