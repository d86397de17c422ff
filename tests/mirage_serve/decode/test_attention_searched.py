"""The searched decode attention's choices and glue (no search here: the interpreter run searches,
``test_attention_fast.py``; the GPU run times, ``test_attention_searched_gpu.py``)."""
from __future__ import annotations

import pytest
import torch

from mirage_serve.decode import attention_searched
from mirage_serve.decode.attention_searched import (AttentionSearch, Decision, Shape, additive_mask, unsearchable)
from mirage_serve.options import PatchOptions

SHAPE = Shape(2, 4, 2, 16, 40, "bfloat16", 0.25, None, None)


class _Graph:
    """A built μGraph as ``decide`` sees it."""

    def describe(self) -> str:
        return "μGraph searched: 2 generated kernels, 4 launches"


@pytest.mark.parametrize("us,kernel,words", [
    ((10.0, 12.0), "searched", "10.0 µs, the hand-written reference 12.0 µs"),
    ((12.0, 10.0), "hand-written", "the hand-written reference timed faster: 10.0 µs against the searched μGraph's 12.0"),
    (None, "searched", "not timed: no GPU"),
])
def test_the_profile_keeps_the_faster_and_says_both_times(us, kernel, words):
    d = AttentionSearch(None, 0, True).decide(SHAPE, _Graph, lambda graph: us)
    assert d.kernel == kernel and words in d.why, d


def test_a_timing_that_raises_leaves_the_reference_and_says_why():
    def boom(graph):
        raise RuntimeError("capture failed")
    d = AttentionSearch(None, 0, True).decide(SHAPE, _Graph, boom)
    assert d == Decision("hand-written", "timing the searched μGraph raised RuntimeError: capture failed")


@pytest.mark.parametrize("mode,kernel", [("searched", "searched"), ("hand-written", "hand-written")])
def test_a_mode_decides_without_timing(mode, kernel):
    built = []

    def graph():
        built.append(1)
        return _Graph()

    def never(graph):
        raise AssertionError("timed although the mode decides")
    search = AttentionSearch(None, 0, True, mode)
    assert search.decide(SHAPE, graph, never).kernel == kernel
    assert search.decision(SHAPE).kernel == kernel  # once per shape
    # 'hand-written' never chooses a μGraph it would not run (a search, on a cold cache)
    assert built == ([] if mode == "hand-written" else [1])


def test_no_searched_graph_runs_the_reference_with_the_reason():
    d = AttentionSearch(None, 0, True).decide(SHAPE, lambda: "its search μGraph did not build: ValueError: x",
                                              lambda graph: (1.0, 2.0))
    assert d == Decision("hand-written", "no searched μGraph: its search μGraph did not build: ValueError: x")


def test_the_attention_option_is_checked():
    with pytest.raises(ValueError, match="attention must be one of"):
        PatchOptions(attention="fast")


def test_the_budget_makes_room_for_the_attention_kernel_and_keeps_zero():
    from superopt.search import SearchBudget
    assert attention_searched._attention_budget(0) == 0
    assert attention_searched._attention_budget(None).max_block_ops >= attention_searched.ATTENTION_BLOCK_OPS
    b = attention_searched._attention_budget(SearchBudget(max_seconds=7.0))
    assert b.max_seconds == 7.0 and b.max_block_ops == attention_searched.ATTENTION_BLOCK_OPS


@pytest.mark.parametrize("kind", ["bool", "additive", "bool1"])
def test_the_mask_becomes_additive_and_bounded_at_the_position(kind):
    rows, cap, pos = 3, 11, 6
    g = torch.Generator().manual_seed(5)
    attends = torch.rand(rows, cap, generator=g) > 0.3
    attends[:, pos + 1:] = True  # a lifted sliding mask attends past the position: the program must not
    given = {"bool": attends, "bool1": attends[:1],
             "additive": torch.where(attends, 0.0, torch.finfo(torch.float32).min)}[kind]
    out = additive_mask(given, rows, torch.bfloat16, torch.tensor(pos))
    want = attends[:1].expand(rows, -1) if kind == "bool1" else attends
    want = want & (torch.arange(cap) <= pos)
    assert out.shape == (rows, 1, 1, cap) and out.dtype == torch.bfloat16
    assert torch.equal(out[:, 0, 0] == 0, want)
    assert torch.all(out[:, 0, 0][~want] == torch.finfo(torch.bfloat16).min)
    assert additive_mask(given, rows, torch.bfloat16, torch.tensor(pos)) is out  # once a step, not once a layer


@pytest.mark.parametrize("inference", [False, True])
def test_each_layers_view_of_one_mask_is_converted_once(inference):
    # under inference_mode (generate() in the bench and the profiles) a view has no _base: it missed every layer
    with torch.inference_mode(inference):
        hf = torch.ones(2, 1, 1, 9, dtype=torch.bool)  # HF's 4D mask; each layer reads mask[:, 0, 0, :]
        out = additive_mask(hf[:, 0, 0, :], 2, torch.float16, torch.tensor(4))
        assert additive_mask(hf[:, 0, 0, :], 2, torch.float16, torch.tensor(4)) is out
        assert additive_mask(hf[:1, 0, 0, :], 2, torch.float16, torch.tensor(4)) is not out  # another view
        assert additive_mask(hf.clone()[:, 0, 0, :], 2, torch.float16, torch.tensor(4)) is not out  # another step


def test_steps_the_program_does_not_describe_are_named():
    x = torch.zeros(2, 1, 32, dtype=torch.bfloat16)
    cos = torch.zeros(1, 16, dtype=torch.bfloat16)
    mask = torch.ones(2, 40, dtype=torch.bool)
    assert unsearchable(x, cos, mask, 16) is None
    assert "RoPE on 8 of 16 dims" in unsearchable(x, cos[:, :8], mask, 16)
    assert "float32" in unsearchable(x, cos.float(), mask, 16)
    assert "no attention mask" in unsearchable(x, cos, None, 16)


def test_a_shape_family_drops_rows_and_capacity_only():
    other = Shape(8, 4, 2, 16, 4096, "bfloat16", 0.25, None, None)
    assert SHAPE.family() == other.family()
    assert SHAPE.family() != Shape(2, 4, 2, 16, 40, "bfloat16", 0.25, 50.0, None).family()
    prog = SHAPE.program()
    assert [v.name for v in prog.inputs] == ["q", "k", "v", "cos", "sin", "k_cache", "v_cache", "pos", "mask"]


def test_a_new_process_reinstantiates_the_structures_an_earlier_one_searched(tmp_path):
    # the first patch searches the family at one capacity and keeps its designs with the entry; a later
    # AttentionSearch over the same cache (another process) re-instantiates them at a new capacity and batch
    from mirage_serve import optimize
    from mirage_serve.cache import KernelCache
    from superopt.search import SearchBudget

    cache = KernelCache(tmp_path / "kc")
    budget = SearchBudget(max_states=200_000, workers=1)
    first = AttentionSearch(cache, budget, True)
    a = Shape(1, 4, 2, 16, 256, "float32", 0.25, None, None)
    chosen = optimize.choose(a.program(), budget=first.budget, arch="sm_90", cache=cache,
                             key=first._key(a, a.program(), torch.device("cpu")), keep_structures=True)
    assert chosen.source == "search" and chosen.graph != a.program()
    later = AttentionSearch(cache, budget, True)
    b = Shape(2, 4, 2, 16, 768, "float32", 0.25, None, None)
    seed = later._stored_seed(b, torch.device("cpu"), "sm_90")
    assert seed is not None
    again = optimize.choose(b.program(), budget=later.budget, arch="sm_90", seed=seed)
    assert again.source == "reinstantiated" and again.graph.num_kernels == chosen.graph.num_kernels
    assert later._stored_seed(Shape(1, 4, 2, 16, 256, "float32", 0.5, None, None), torch.device("cpu"),
                              "sm_90") is None  # another scale: another family, nothing stored


def _unbuildable():
    raise AssertionError("a μGraph was chosen (a search on a cold cache) where a smaller capacity decides")


@pytest.mark.parametrize("us,carried", [((9.3, 6.0), True), ((9.0, 8.0), False), ((9.0, 10.0), False)])
def test_a_reference_that_won_clearly_decides_longer_caches_unsearched(us, carried):
    search = AttentionSearch(None, 0, True)
    small = Shape(1, 4, 2, 16, 256, "bfloat16", 0.25, None, None)
    search.decide(small, _Graph, lambda graph: us)
    longer = Shape(1, 4, 2, 16, 768, "bfloat16", 0.25, None, None)
    built = []
    d = search.decide(longer, lambda: built.append(1) or _Graph(), lambda graph: (5.0, 4.0))
    assert built == ([] if carried else [1])
    if carried:
        assert d.kernel == "hand-written" and d.searched_us is None
        assert "6.0 µs against the searched μGraph's 9.3 µs at cache 256" in d.why and "768 is not searched" in d.why


@pytest.mark.parametrize("other", [
    Shape(1, 4, 2, 16, 128, "bfloat16", 0.25, None, None),   # a shorter cache: the order may turn
    Shape(8, 4, 2, 16, 768, "bfloat16", 0.25, None, None),   # other rows: other designs
    Shape(1, 4, 2, 16, 768, "float16", 0.25, None, None),    # another dtype
])
def test_only_a_longer_cache_of_the_same_rows_and_heads_is_carried(other):
    search = AttentionSearch(None, 0, True)
    search.decide(Shape(1, 4, 2, 16, 256, "bfloat16", 0.25, None, None), _Graph, lambda graph: (9.3, 6.0))
    built = []
    search.decide(other, lambda: built.append(1) or _Graph(), lambda graph: (5.0, 4.0))
    assert built == [1]


@pytest.mark.parametrize("mode", ["searched", "hand-written"])
def test_a_forced_mode_is_never_carried(mode):
    search = AttentionSearch(None, 0, True, mode)
    search._profiles[Shape(1, 4, 2, 16, 256, "bfloat16", 0.25, None, None)] = (9.3, 6.0)
    d = search.decide(Shape(1, 4, 2, 16, 768, "bfloat16", 0.25, None, None), _Graph, lambda graph: (1.0, 2.0))
    assert d.kernel == mode and "not searched" not in d.why


def test_a_later_process_carries_the_profile_its_user_signed_and_no_other(tmp_path):
    from dataclasses import replace as replaced

    from mirage_serve.cache import CacheEntry, KernelCache
    from superopt.ir.text import to_text

    cpu = torch.device("cpu")
    small = Shape(1, 4, 2, 16, 256, "float32", 0.25, None, None)
    longer = replaced(small, capacity=1024)
    cache = KernelCache(tmp_path / "kc")
    first = AttentionSearch(cache, 0, True)
    key = first._key(small, small.program(), cpu)
    cache.put(key, CacheEntry(to_text(small.program()), {}, {}, {"verified": True}))
    first.decide(small, _Graph, lambda graph: (9.3, 6.0), cpu)
    kept = cache.get(key).meta["versus_reference"]
    assert kept == {"searched_us": 9.3, "reference_us": 6.0, "device": "cpu"}

    later = AttentionSearch(KernelCache(tmp_path / "kc"), 0, True)
    d = later.decide(longer, _unbuildable, lambda graph: (5.0, 4.0), cpu)
    assert d.kernel == "hand-written" and "at cache 256" in d.why
    # the same times in an entry this user did not sign (here: shipped with the package) decide nothing
    assert cache.export_shipped(tmp_path / "shipped") == 1
    shipped = KernelCache(tmp_path / "empty", shipped_dir=tmp_path / "shipped")
    assert shipped.get(key).meta["versus_reference"] == kept and not shipped.get(key).signed
    built = []
    AttentionSearch(shipped, 0, True).decide(longer, lambda: built.append(1) or _Graph(),
                                              lambda graph: (5.0, 4.0), cpu)
    assert built == [1]


def test_a_mask_written_in_place_between_steps_is_converted_again():
    # step_mask.StepMask keeps one buffer and sets a column a step: same address, a new version
    mask = torch.zeros(2, 1, 1, 9, dtype=torch.bool)
    mask[..., :4] = True
    first = additive_mask(mask[:, 0, 0, :], 2, torch.float32, torch.tensor(8)).clone()
    mask.index_fill_(3, torch.tensor([4]), True)
    again = additive_mask(mask[:, 0, 0, :], 2, torch.float32, torch.tensor(8))
    assert (first == 0).sum() == 2 * 4 and (again == 0).sum() == 2 * 5
