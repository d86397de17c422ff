"""Launches per GPU model: what a patch runs from a shipped entry on each GPU, and how shipping adds a GPU's row."""
from __future__ import annotations

import shutil
from dataclasses import replace

import pytest

from mirage_serve import optimize
from mirage_serve.cache import CacheKey, KernelCache, versions_now
from mirage_serve.cache.archive import ship_into
from mirage_serve.cache.entry import read_entry, write_entry
from mirage_serve.cache.gpu_rows import for_gpu, timed_elsewhere, with_row
from mirage_serve.cache.stale_launches import DEFAULT, stale_launches
from superopt.codegen.launch import Launch, read_launches
from superopt.ir import digest
from tests.fixtures.budget import states_budget
from tests.fixtures.programs import down_proj

A = {"launch": {"k0": [2, 3]}, "median_us": 42.3, "profile": "a", "render_sha256": "ra", "timed_on": "GPU A",
     "timings": [["t"]], "verified": True}


def test_for_gpu_puts_the_gpus_row_in_place_of_the_default():
    meta = {**A, "launch_by_gpu": {"GPU B": {"launch": {"k0": [4, 4]}, "median_us": 32.1, "profile": "b",
                                             "render_sha256": "rb"}}}
    b = for_gpu(meta, "GPU B")
    assert b["launch"] == {"k0": [4, 4]} and b["median_us"] == 32.1 and b["render_sha256"] == "rb"
    assert b["timed_on"] == "GPU B" and b["verified"] is True and "timings" not in b  # the default's timings
    assert for_gpu(meta, "GPU A") is meta and for_gpu(meta, "GPU C") is meta and for_gpu(meta, "") is meta
    assert not timed_elsewhere(b, "GPU B") and timed_elsewhere(meta, "GPU C") and not timed_elsewhere(meta, "")
    assert timed_elsewhere({"launch": {}}, "GPU A")  # an entry from before timed_on was recorded


def test_with_row_adds_a_row_or_replaces_the_same_gpus_default():
    b = {"launch": {"k0": [4, 4]}, "median_us": 32.1, "profile": "b", "render_sha256": "rb", "timed_on": "GPU B",
         "timings": [["tb"]]}
    merged = with_row(A, b)
    assert merged["launch"] == A["launch"] and merged["timings"] == A["timings"]
    assert merged["launch_by_gpu"] == {"GPU B": {"launch": {"k0": [4, 4]}, "median_us": 32.1, "profile": "b",
                                                 "render_sha256": "rb"}}
    again = with_row(merged, {**b, "median_us": 30.0})   # the same GPU timed again: its row is replaced
    assert again["launch_by_gpu"]["GPU B"]["median_us"] == 30.0 and len(again["launch_by_gpu"]) == 1
    a2 = with_row(merged, {**A, "launch": {"k0": [8, 2]}, "timings": [["ta2"]]})   # the default's own GPU
    assert a2["launch"] == {"k0": [8, 2]} and a2["timings"] == [["ta2"]] and "GPU A" not in a2["launch_by_gpu"]
    with pytest.raises(ValueError, match="names no GPU"):
        with_row(A, {"launch": {}})


def _pick(warps: int, stages: int, calls: list, index: int = 0):
    """A stand-in profiler: the ``index``-th searched candidate offered, at one launch."""
    def pick(result):
        cands = result.candidates()
        calls.append(len(cands))
        g = [c for c in cands if c != down_proj()][index]
        return optimize.Pick(g, {"k0": Launch(warps, stages)}, 10.0 * warps, f"w{warps}s{stages}")
    return pick


def _export(tmp_path, gpu: str, warps: int, stages: int, index: int = 0):
    program = down_proj()
    key = CacheKey(digest(program), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_out-m2")
    maker = KernelCache(tmp_path / f"maker {gpu} {index}", shipped_dir=False)
    optimize.choose(program, budget=states_budget(), arch="sm_90", cache=maker, key=key,
                    pick=_pick(warps, stages, [], index), gpu=gpu)
    out = tmp_path / f"exported {gpu} {index}"
    assert maker.export_shipped(out) == 1
    return program, key, out


def test_each_gpu_runs_its_own_row_and_an_unknown_one_is_timed_again_only_when_asked(tmp_path):
    program, key, shipped = _export(tmp_path, "GPU A", 2, 3)
    _, _, from_b = _export(tmp_path, "GPU B", 4, 4)
    [(name, action)] = ship_into(from_b, shipped)
    assert action == "launch row for GPU B"

    def hit(gpu: str, retime: bool = False):
        shutil.rmtree(tmp_path / "user", ignore_errors=True)
        cache = KernelCache(tmp_path / "user", shipped_dir=shipped)
        calls = []
        choice = optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key,
                                 pick=_pick(8, 2, calls), gpu=gpu, retime=retime)
        assert choice.source == "cache"
        return choice, calls, cache.get(key).meta

    b, calls, meta = hit("GPU B", retime=True)
    assert b.launch == {"k0": Launch(4, 4)} and calls == []   # its row: nothing timed
    assert meta["timed_on"] == "GPU B" and read_launches(meta["launch"]) == {"k0": Launch(4, 4)}
    a, calls, _ = hit("GPU A", retime=True)
    assert a.launch == {"k0": Launch(2, 3)} and calls == []
    c, calls, meta = hit("GPU C")              # no row, not asked: the default launch, untimed
    assert c.launch == {"k0": Launch(2, 3)} and calls == [] and meta["timed_on"] == "GPU A"
    c, calls, meta = hit("GPU C", retime=True)  # asked: the shipped μGraph's launches alone are timed here
    assert calls == [1] and c.launch == {"k0": Launch(8, 2)} and c.graph == a.graph
    assert "launch profiled again (timed on GPU A)" in c.note and meta["timed_on"] == "GPU C"
    assert meta["launch_by_gpu"]["GPU B"]["launch"] == {"k0": [4, 4]}  # the rows travel on, for the next export


def test_shipping_another_mugraph_replaces_the_entry_and_its_rows(tmp_path):
    _, _, shipped = _export(tmp_path, "GPU A", 2, 3)
    _, _, from_b = _export(tmp_path, "GPU B", 4, 4)
    ship_into(from_b, shipped)
    _, _, other = _export(tmp_path, "GPU B", 4, 4, index=-1)
    assert ship_into(other, shipped, labels={"attn_in-m2"}) == []   # only the labels asked for
    [(name, action)] = ship_into(other, shipped, labels={"mlp_out-m2"})
    assert action == "replaced: another μGraph"
    meta = KernelCache(tmp_path / "u", shipped_dir=shipped).get(
        CacheKey(digest(down_proj()), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_out-m2")).meta
    assert "launch_by_gpu" not in meta and meta["timed_on"] == "GPU B"
    assert sorted(p.name for p in shipped.iterdir()) == [name]   # no staging folder left behind


def test_stale_launches_names_each_launch_timed_on_source_the_renderer_no_longer_writes(tmp_path):
    _, _, shipped = _export(tmp_path, "GPU A", 2, 3)
    _, _, from_b = _export(tmp_path, "GPU B", 4, 4)
    ship_into(from_b, shipped)
    assert stale_launches(shipped) == []     # both launches timed on what the renderer writes now

    (path,) = [p for p in shipped.iterdir() if p.is_dir()]
    key, entry = read_entry(path)            # the shipped form's key (CacheKey.for_shipped)
    rows = {"GPU B": {**entry.meta["launch_by_gpu"]["GPU B"], "render_sha256": "0" * 64}}   # timed on other code
    shutil.rmtree(path)
    path.mkdir()
    write_entry(path, key, replace(entry, meta={**entry.meta, "launch_by_gpu": rows}))
    assert [(s.entry, s.row, s.key) for s in stale_launches(shipped)] == [(path.name, "GPU B", key)]

    meta = {**entry.meta, "render_sha256": "1" * 64}   # the default timed on other code, GPU B's row current
    shutil.rmtree(path)
    path.mkdir()
    write_entry(path, key, replace(entry, meta=meta))
    assert [(s.entry, s.row) for s in stale_launches(shipped)] == [(path.name, DEFAULT)]
