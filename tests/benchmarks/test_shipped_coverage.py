"""The committed kernels_cache/ still serves registry models: a change to extraction, to the
canonical program text or to the cache key that silently orphaned every shipped entry (users
would pay a search on their first patch()) fails here. Two small models, checked on the CPU."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "shipped_coverage.py"
_spec = importlib.util.spec_from_file_location("shipped_coverage", _PATH)
coverage = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = coverage
_spec.loader.exec_module(coverage)


@pytest.mark.parametrize("model", ["SmolLM2-135M", "Qwen2.5-0.5B"])
def test_every_program_of_the_model_has_a_shipped_entry(model, capsys):
    with pytest.raises(SystemExit) as done:
        coverage.main([model])
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    # 25 programs (5 site programs x 5 buckets: stacked q/k/v, the norm, o_proj and down_proj with the
    # residual adds fused, the gated MLP) and the 10 unfused o_proj / down_proj programs a layer falls back to
    assert "35/ 35 programs shipped" in out


def test_prune_keeps_the_paired_entries_of_used_programs_only(tmp_path):
    def entry(name, text):
        (tmp_path / name).mkdir()
        (tmp_path / name / "ugraph.txt").write_text(text)

    entry("attn_in_1-m1-aaaa", "graph kv\n")
    entry("attn_in_1_m1_fused-paired-bbbb", "graph kv\n")
    entry("attn_in_1_m1_fused-paired-cccc", "graph another\n")
    entry("mlp_in-m1-dddd", "graph another\n")  # not in use: its paired twin goes too
    assert coverage.paired_in_use(tmp_path, {"attn_in_1-m1-aaaa"}) == {"attn_in_1_m1_fused-paired-bbbb"}


def test_remove_deletes_the_programs_entries_in_both_layers(tmp_path, monkeypatch, capsys):
    # An earlier patch() copies each shipped hit into the user cache; a --remove that left those
    # copies would let them stand in for the shipped entries, and the next warm would search nothing.
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    monkeypatch.setenv("MIRAGE_SERVE_CACHE_DIR", str(user))
    keys = list(coverage.cache_keys("SmolLM2-135M", (1, 8)))
    for _, _, key in keys:
        (shipped / key.for_shipped().dirname()).mkdir(parents=True, exist_ok=True)
        (user / key.dirname()).mkdir(parents=True, exist_ok=True)
    with pytest.raises(SystemExit):
        coverage.main(["SmolLM2-135M", "--batch", "1,8", "--remove", "attn_in", "--shipped", str(shipped)])
    assert "removed attn_in@b8" in capsys.readouterr().out
    for label, _, key in keys:
        for entry in (shipped / key.for_shipped().dirname(), user / key.dirname()):
            assert entry.is_dir() == (label != "attn_in"), entry


def test_a_hit_whose_launch_is_stale_is_named_with_the_warm_call_that_refreshes_it(monkeypatch, capsys):
    # stale: timed on source the renderer no longer writes; a user's first patch() times it again
    from mirage_serve.cache.stale_launches import StaleLaunch

    key = next(k for label, _, k in coverage.cache_keys("SmolLM2-135M", (1,)) if label == "mlp_in")
    shipped = key.for_shipped()
    monkeypatch.setattr(coverage, "stale_launches",
                        lambda folder: [StaleLaunch(shipped.dirname(), "NVIDIA H200", shipped)])
    with pytest.raises(SystemExit) as done:
        coverage.main(["SmolLM2-135M", "--batch", "1,8"])
    out = capsys.readouterr().out
    assert done.value.code == 0, out    # a stale launch costs time, not a search: not a miss
    assert "14/ 14 programs shipped; stale launches: mlp_in@b1 (NVIDIA H200)" in out
    assert 'WARM_MODELS="SmolLM2-135M" WARM_BATCH=1 bash benchmarks/gpu_session.sh warm' in out
