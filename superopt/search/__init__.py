"""The μGraph search: tiling patterns from the shapes, block-level enumeration pruned by abstract
expressions, kernel-level split + combine, verification and cost ranking (issue 3).

    from superopt.search import superoptimize, SearchBudget
    result = superoptimize(program, budget=SearchBudget(max_seconds=60), seed=0, checkpoint="run.jsonl")
    result.best, result.ranked, result.stats
    result.reinstantiate(program_at_other_shape)
"""
from .budget import SearchBudget, SearchStats
from .driver import SearchResult, superoptimize

__all__ = ["SearchBudget", "SearchResult", "SearchStats", "superoptimize"]
