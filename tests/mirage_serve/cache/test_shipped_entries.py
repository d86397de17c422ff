"""Every shipped entry (``kernels_cache/``) parses and renders with the current code generator, and
a deterministic sample is verified again against the program it was searched for, as patch() takes
it on first use: widened to the program's precision where it computes narrower
(``superopt.verify.upcast``), then clean for the dtype check.

Which are verified: every program of one decoder layer of the two smallest registry families
(SmolLM2-135M, hidden 576; Qwen2.5-0.5B, hidden 896) at batch buckets 1 and 8, with the residual
adds fused and without: the reduced shapes of the shipped set. A μGraph's tiling cannot be put at
another shape without the search's design, which an entry does not keep, and verifying a
Llama-3.1-8B entry at its own shape costs up to ~15 s on this CI's CPUs, so the larger models'
entries are checked by patch() on first use (``mirage_serve.optimize``), not here.
"""
from __future__ import annotations

import pytest

from mirage_serve.cache import CacheKey, KernelCache, shipped_cache_dir
from mirage_serve.cache.entry import read_entry
from mirage_serve.cache.stale_launches import DEFAULT, stale_launches
from superopt.codegen.launch import read_launches, rendering
from superopt.codegen.triton import render_triton
from superopt.ir import check, digest, from_text
from superopt.verify import check_equivalent
from superopt.verify.precision import constant_violations, precision_violations
from superopt.verify.upcast import upcast

SAMPLE_MODELS = ("SmolLM2-135M", "Qwen2.5-0.5B")
SAMPLE_BUCKETS = (1, 8)


def _rows():
    shipped = shipped_cache_dir()
    rows = KernelCache(shipped / ".no-user-layer", shipped_dir=shipped, read_only=True).verify(("shipped",))
    assert rows and all(r.ok for r in rows), [(r.path.name, r.reason) for r in rows if not r.ok]
    return shipped, rows


def test_every_shipped_entry_parses_and_renders():
    shipped, rows = _rows()
    for r in rows:
        _, entry = read_entry(r.path, r.key)
        graph = check(from_text(entry.ugraph_text))
        launch = read_launches(entry.meta.get("launch")) or {}
        module = render_triton(graph, **rendering(launch))
        customized = sum(n.op == "customized" for n in graph.nodes)
        assert len(module.kernels) == customized - len({s.tail for s in module.kernels if s.tail >= 0}), r.path.name
    # a launch choice profiled on code the renderer no longer produces is profiled again on the GPU;
    # most of the shipped set must still be current, or every user pays that on first patch()
    # (benchmarks/shipped_coverage.py names them per model, with the GPU call that refreshes them)
    current = len(rows) - len({s.entry for s in stale_launches(shipped) if s.row == DEFAULT})
    assert current >= len(rows) // 2, f"only {current} of {len(rows)} shipped launch choices are current"


def _programs():
    from mirage_serve.patching.programs import layer_programs

    seen = {}
    for name in SAMPLE_MODELS:
        for fused in (True, False):
            for label, m, g in layer_programs(name, SAMPLE_BUCKETS, fused_residual=fused):
                seen.setdefault((digest(g), m), (name, label, m, g))
    return list(seen.values())


@pytest.fixture(scope="module")
def programs():
    return _programs()


def test_sampled_shipped_entries_verify_against_their_programs(programs):
    from mirage_serve.cache import versions_now

    cache = KernelCache(shipped_cache_dir() / ".no-user-layer", read_only=True)
    assert len(programs) >= 20
    for name, label, m, program in programs:
        what = f"{name} {label}@b{m}"
        key = CacheKey(digest(program), f"b{m}", "bf16", "sm90", "triton", versions_now(), f"{label}-m{m}")
        entry = cache.get(key)
        assert entry is not None and entry.origin == "shipped" and not entry.signed, what
        # as patch() takes it on first use (mirage_serve.optimize): widened to the program's
        # precision where it computes narrower, and then clean for the dtype check
        graph, _ = upcast(program, from_text(entry.ugraph_text))
        assert precision_violations(program, graph) == [], what
        v = check_equivalent(program, graph)
        assert v.equivalent, f"{what}: {v}"
        render_triton(graph)


@pytest.mark.slow
def test_shipped_gemma2_entries_that_round_constants_are_widened_on_first_use():
    """Gemma-2-2B's shipped q/k/v entries (hidden 2304) cast eps and 1/2304 to bf16, which the
    program keeps in fp32 (issue 32). As shipped they fail the value check, which sees a constant's
    rounding, and the dtype check names the constants; widened as patch() takes them, they pass."""
    from mirage_serve.cache import versions_now
    from mirage_serve.patching.programs import layer_programs

    cache = KernelCache(shipped_cache_dir() / ".no-user-layer", read_only=True)
    seen = set()
    for label, m, program in layer_programs("Gemma-2-2B", (1,), fused_residual=True, stacked=False):
        if not label.startswith("attn_in") or label in seen:   # k and v share one program
            continue
        key = CacheKey(digest(program), f"b{m}", "bf16", "sm90", "triton", versions_now(), f"{label}-m{m}")
        entry = cache.get(key)
        assert entry is not None and entry.origin == "shipped", label
        shipped = from_text(entry.ugraph_text)
        assert [v.split(" (")[0] for v in constant_violations(program, shipped)] == [
            "constant 1e-06 in bfloat16", "constant 0.000434028 in bfloat16"], label
        assert not check_equivalent(program, shipped).equivalent, label
        graph, widened = upcast(program, shipped)
        assert sum("of constant" in w for w in widened) == 2, widened
        assert precision_violations(program, graph) == [], label
        v = check_equivalent(program, graph)
        assert v.equivalent, f"{label}: {v}"
        seen.add(label)
    assert len(seen) == 2   # q's entry and k/v's
