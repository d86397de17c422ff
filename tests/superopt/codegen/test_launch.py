"""Launch: one kernel's launch variant, and the stored list form every cache entry holds."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from superopt.codegen.launch import (Launch, chained, ordered_sums, prefetched, read_launches, rendering,
                                     stored_launches)

SHIPPED = Path(__file__).resolve().parents[3] / "kernels_cache"


@pytest.mark.parametrize("stored, want", [
    ([4, 3], Launch(4, 3)),
    ([2, 3, 1], Launch(2, 3, prefetch=True)),
    ([2, 3, 0, 1], Launch(2, 3, chain=True)),
    ([8, 4, 1, 1], Launch(8, 4, prefetch=True, chain=True)),
    ([2, 4, 0, 0, 1], Launch(2, 4, ordered=True)),
    ([4, 3, 1, 0, 1], Launch(4, 3, prefetch=True, ordered=True)),
])
def test_the_stored_form_round_trips(stored, want):
    assert Launch.of(stored) == want and Launch.of(tuple(stored)) == want
    assert want.stored() == stored and Launch.of(want) is want


@pytest.mark.parametrize("bad", [[4], [4, 3, 1, 1, 1, 1], [3, 3], [4, 0], ["4", 3], [4.0, 3], [True, 3], "w4s3"])
def test_a_malformed_launch_is_refused_with_its_value(bad):
    with pytest.raises(ValueError):
        Launch.of(bad)


def test_labels_and_the_variants_a_table_renders():
    table = {"k0": Launch(2, 3, prefetch=True), "k1": Launch(4, 4, chain=True), "k2": Launch(8, 3),
             "k3": Launch(4, 3, chain=True, ordered=True)}
    assert [v.label for v in table.values()] == ["w2s3p", "w4s4c", "w8s3", "w4s3co"]
    assert prefetched(table) == {"k0"} and chained(table) == {"k1", "k3"} and ordered_sums(table) == {"k3"}
    assert rendering(table) == {"prefetch": {"k0"}, "chain": {"k1", "k3"}, "ordered": {"k3"}}
    assert read_launches(stored_launches(table)) == table and read_launches(None) is None
    assert prefetched(None) == frozenset() and stored_launches(None) == {}


def test_every_shipped_entry_reads_and_writes_back_unchanged():
    metas = sorted(SHIPPED.glob("*/meta.json"))
    assert len(metas) > 100  # the shipped cache is present in a checkout
    read = 0
    for path in metas:
        meta = json.loads(path.read_text())["meta"]
        rows = [r.get("launch") for r in meta.get("launch_by_gpu", {}).values()]   # other GPUs' (cache.gpu_rows)
        for stored in [meta.get("launch"), *rows]:
            if stored is None:
                continue
            assert stored_launches(read_launches(stored)) == stored, path.parent.name
            read += 1
    assert read > 100
