"""A search result's structures as JSON, so that another process re-instantiates them without searching.

``SearchResult.reinstantiate`` needs only the verified designs (kernel skeletons) of a result, not its
graphs: it builds each at the new shape and verifies it again (``driver._rank_and_verify``). So a
result's designs, written out (``to_json``), and read back into a result that holds nothing else
(``from_json``), serve as ``mirage_serve.optimize.choose``'s seed in a later process: a decode-attention
program at another cache capacity is then re-instantiated, not searched (``mirage_serve.decode.
attention_searched``). A program with data movement keeps its core's and its pre programs' designs
(``movement_search.LoweredResult``). Nothing read back is trusted: every design is verified at the new
shape, and a design that no longer fits is dropped there.
"""
from __future__ import annotations

from .budget import SearchBudget, SearchStats
from .driver import SearchResult
from .skeleton import design_from_json, design_to_json


def to_json(result: SearchResult) -> dict:
    """The designs of ``result`` (and of its core and pre programs), as plain JSON."""
    from .movement_search import LoweredResult
    if isinstance(result, LoweredResult):
        return {"inner": to_json(result.inner), "pre": [to_json(r) for r in result.pre]}
    return {"designs": [design_to_json(d) for d, _ in result.designs if d is not None]}


def from_json(data: dict, budget: SearchBudget, arch: str, seed: int = 0) -> SearchResult:
    """A result holding only the designs of ``data`` (``to_json``'s), for ``reinstantiate``; ValueError if
    ``data`` is not of that form."""
    from .movement_search import LoweredResult
    try:
        if "inner" in data:
            return LoweredResult(None, budget, arch, seed, [], SearchStats(),
                                 inner=from_json(data["inner"], budget, arch, seed),
                                 pre=tuple(from_json(p, budget, arch, seed) for p in data["pre"]))
        designs = [(design_from_json(d), None) for d in data["designs"]]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"not a search result's structures ({type(e).__name__}: {e})") from None
    return SearchResult(None, budget, arch, seed, [], SearchStats(), designs)
