"""PatchReport: what patch() did to each site of a model, and why, as data and as a table."""
from __future__ import annotations

from dataclasses import dataclass, field, fields


@dataclass
class SiteReport:
    layer: int                     # -1: a site outside the decoder layers (the final norm)
    site: str                      # "attn_in", "attn_out", "mlp_in", "mlp_out", or a block left original
    modules: tuple[str, ...]       # module paths in the model
    patched: bool = False
    reason: str = ""               # why not patched, or a note
    program: str = ""              # digest of the extracted Lax program
    parts: int = 1                 # programs the site runs as (sites.site_parts: norm, consumer groups)
    kernels: int = 0               # customized (fused) kernels in the chosen μGraph
    launches: int = 0              # kernel launches per call (library ops + customized)
    source: str = ""               # "cache", "search", "reinstantiated" or "fallback"
    block_sums: int = 0            # kernels that sum partial results across thread blocks (split-K, split attention)
    source_note: str = ""          # why that source (e.g. "superopt.search is not installed")
    verdict: str = ""
    check_error: float | None = None   # numeric self-check: max rel. Frobenius error vs float64
    times: dict[str, float] = field(default_factory=dict)  # extract/optimize/verify/build/check (s)
    profile: dict[str, str] = field(default_factory=dict)  # "<program> b<M>" -> what the GPU profiler measured


@dataclass
class Counts:
    """What the prepare stage did, per (program, bucket): kept by ``patching.prepare.Preparer`` and added
    to the report by the pipeline, the one writer of the report (docs/architecture.md)."""
    searches: int = 0
    reinstantiated: int = 0        # searched structures re-instantiated at another bucket
    compiles: int = 0
    cache_hits: int = 0
    programs: int = 0              # distinct (program, bucket) pairs


@dataclass
class PatchReport:
    model_type: str
    backend: str
    device: str
    dtype: str
    batch_sizes: tuple[int, ...]
    supported: bool = True
    note: str = ""
    sites: list[SiteReport] = field(default_factory=list)
    searches: int = 0
    reinstantiated: int = 0        # searched structures re-instantiated at another bucket
    compiles: int = 0
    cache_hits: int = 0
    programs: int = 0              # distinct (program, bucket) pairs
    cuda_graphs: bool = False      # generate() replays decode steps from CUDA graphs
    deterministic: bool = False    # PatchOptions.deterministic: cross-block sums in a fixed order
    seconds: float = 0.0
    # patch()'s stages in order -> seconds: "sites" (the adapter, or the traced partition), "residual
    # plan", "prepare" (every site: extract, choose, verify, build, self-check), "install", "attention", "graphs"
    stages: dict[str, float] = field(default_factory=dict)

    def add_counts(self, counts: Counts) -> None:
        """The prepare stage's counters (``Counts``), added by the pipeline."""
        for f in fields(Counts):
            setattr(self, f.name, getattr(self, f.name) + getattr(counts, f.name))

    @property
    def patched(self) -> list[SiteReport]:
        return [s for s in self.sites if s.patched]

    @property
    def unpatched(self) -> list[SiteReport]:
        return [s for s in self.sites if not s.patched]

    def __str__(self) -> str:
        head = (f"mirage_serve.patch: {self.model_type} on {self.device} ({self.dtype}), backend "
                f"{self.backend}, decode buckets {list(self.batch_sizes)}")
        lines = [head]
        if self.note:
            lines.append(self.note)
        if not self.supported:
            return "\n".join(lines)
        lines.append(self.rows_note())
        rows = [("layer", "site", "patched", "source", "kern", "launch", "check err", "time s",
                 "verdict / reason")]
        for s in self.sites:
            err = "" if s.check_error is None else f"{s.check_error:.1e}"
            why = s.verdict if s.patched else s.reason
            rows.append((str(s.layer) if s.layer >= 0 else "model", s.site, "yes" if s.patched else "no", s.source,
                         str(s.kernels or ""), str(s.launches or ""), err, f"{sum(s.times.values()):.2f}", why))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        notes = sorted({f"{s.source}: {s.source_note}" for s in self.sites if s.source_note and s.source != "search"})
        lines += [f"μGraph source {n}" for n in notes]
        profiled = {k: p for s in self.sites for k, p in s.profile.items()}
        lines += [f"profiled {k}: {p}" for k, p in sorted(profiled.items())]
        if note := self.block_sums_note():
            lines.append(note)
        lines.append(self.counts())
        return "\n".join(lines)

    def block_sums_note(self) -> str:
        """One line where some site's kernels sum partial results across thread blocks: whether those sums are in a
        fixed order (``PatchOptions.deterministic``) or float atomic adds, whose order varies from run to run."""
        summed = [s for s in self.patched if s.block_sums]
        if not summed:
            return ""
        sites = ", ".join(sorted({s.site for s in summed}))
        if self.deterministic:
            return (f"cross-block sums: {len(summed)} sites ({sites}) add their blocks' partial sums in a fixed order "
                    f"(PatchOptions.deterministic): every run gives the same bits")
        return (f"cross-block sums: {len(summed)} sites ({sites}) add their blocks' partial sums with float atomics, "
                f"whose order varies: the last bits, and at a near-tie a greedy token, can differ between runs "
                f"(PatchOptions.deterministic=False / MIRAGE_SERVE_DETERMINISTIC=0 asked for it)")

    def rows_note(self) -> str:
        """One line: which forward calls the patched sites leave to the original modules. A site's
        kernels exist only for the decode buckets (patching.prepare.SiteRuntime), so a call with more
        rows, every prefill among them, runs the model as it was: a user must not read the table
        as "the whole generate() is fused"."""
        top = max(self.batch_sizes) if self.batch_sizes else 0
        return (f"not patched: forward calls with more than {top} row{'s' * (top != 1)} (batch × tokens: prefill, "
                f"or a decode batch above the largest bucket) run the original modules")

    def counts(self) -> str:
        """One line: sites patched, programs, and where they came from (search, cache, compile)."""
        return (f"{len(self.patched)}/{len(self.sites)} sites patched; {self.programs} distinct "
                f"programs; {self.searches} searches, {self.reinstantiated} re-instantiated, "
                f"{self.compiles} compiles, {self.cache_hits} cache hits; {self.seconds:.1f} s"
                + (f" ({', '.join(f'{k} {v:.2f}' for k, v in self.stages.items())})" if self.stages else ""))
