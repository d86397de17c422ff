"""The decode-step profile summary: per-kernel aggregation, busy time with overlaps, idle gaps."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "profile_decode_step.py"
_spec = importlib.util.spec_from_file_location("profile_decode_step", _PATH)
prof = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = prof  # dataclasses look their module up there
_spec.loader.exec_module(prof)


def test_summary_counts_overlap_once_and_reports_gaps_per_step():
    K = prof.KernelSpan
    # two steps: a(0-10) b(12-20) | a(30-40) b(35-50): gaps 2 and 10; overlap of 5 in step 2
    spans = [K("b", 12, 20), K("a", 0, 10), K("a", 30, 40), K("b", 35, 50)]
    s = prof.summarize(spans, steps=2)
    assert s["kernels_per_step"] == 2
    assert s["wall_us"] == pytest.approx(25.0)           # (50 - 0) / 2
    assert s["busy_us"] == pytest.approx((10 + 8 + 20) / 2)
    assert s["gap_us"] == pytest.approx((50 - 38) / 2)
    rows = {n: (c, us) for n, c, us in s["rows"]}
    assert rows["a"] == (1.0, 10.0) and rows["b"] == (1.0, 11.5)
    assert s["rows"][0][0] == "b"  # sorted by time, largest first


def test_marginal_times_add_up_to_the_step_under_overlap_and_gaps():
    K = prof.KernelSpan
    # a(0-10); b launched early (5) and waiting until a ends, done at 20; c after a gap of 5; d inside c
    spans = [K("c", 25, 40), K("a", 0, 10), K("b", 5, 20), K("d", 30, 35)]
    rows = {n: (c, us, early) for n, c, us, early in prof.marginal(spans, steps=1)}
    assert rows["a"] == (1.0, 10.0, 0.0)
    assert rows["b"] == (1.0, 10.0, 5.0)      # its span is 15; the step grew by 10
    assert rows["c"] == (1.0, 20.0, -5.0)     # the gap before it is its own
    assert rows["d"] == (1.0, 0.0, 10.0)      # ends inside c: costs the step nothing
    assert sum(us for _, us, _ in rows.values()) == 40.0  # the step's span
    assert [r[0] for r in prof.marginal(spans, steps=1)][0] == "c"  # largest first


def test_summary_of_nothing_is_zero():
    s = prof.summarize([], steps=4)
    assert s["busy_us"] == 0 and s["wall_us"] == 0 and s["rows"] == []


def test_site_bandwidth_attributes_a_programs_kernels_to_it():
    rows = [("attn_in_m1_fused_k0", 32.0, 320.0),       # q: 32 calls of 10 µs
            ("attn_in_1_m1_fused_k0", 64.0, 320.0),     # k and v: one program, 64 calls of 5 µs
            ("mlp_in_m1_fused_k0", 32.0, 600.0), ("mlp_in_m1_fused_k1", 32.0, 40.0),  # 2 kernels/call
            ("nvjet_sm90_tst_64x8", 32.0, 300.0)]        # a library GEMV: no site
    got = {r[0]: r for r in prof.site_bandwidth(rows, {"attn_in": 1_000_000, "attn_in_1": 250_000,
                                                        "mlp_in": 4_000_000, "mlp_out": 2_000_000})}
    assert set(got) == {"attn_in", "attn_in_1", "mlp_in"}  # mlp_out ran as the library kernel
    assert got["attn_in"][1:4] == (32.0, 10.0, 1_000_000) and got["attn_in"][4] == pytest.approx(100.0)
    assert got["attn_in_1"][1:3] == (64.0, 5.0) and got["attn_in_1"][4] == pytest.approx(50.0)
    assert got["mlp_in"][2] == pytest.approx(20.0) and got["mlp_in"][4] == pytest.approx(200.0)
    assert next(iter(prof.site_bandwidth(rows, {"attn_in": 1, "mlp_in": 1})))  # largest time first


def _trace(prefill: list[str], step: list[str], steps: int) -> list:
    names = prefill + step * steps
    return [prof.KernelSpan(n, 10 * i, 10 * i + 5) for i, n in enumerate(names)]


def test_decode_steps_are_the_repeating_tail_whatever_the_prefill_launched():
    # a step: three layers of (norm, gemv, add), then the head; the prefill: other kernels, more of them
    step = ["norm", "gemv", "add"] * 3 + ["lm_head", "argmax"]
    prefill = ["sdpa", "gemm", "add", "norm"] * 7 + step  # HF's path, then the warm (first) step
    spans, exact = prof.decode_steps(_trace(prefill, step, 5), steps=5)
    assert exact and [s.name for s in spans] == step * 5  # not a layer's period: the head breaks it
    s = prof.summarize(spans, steps=5)
    assert s["kernels_per_step"] == len(step)


def test_decode_steps_fall_back_to_the_proportional_cut_when_steps_differ():
    trace = _trace(["p"] * 3, [], 0) + _trace([], ["a", "b", "c"], 1) + _trace([], ["a", "c", "b"], 1)
    spans, exact = prof.decode_steps(trace, steps=2)
    assert not exact and len(spans) == round(len(trace) * 2 / 3)


def test_a_paired_program_counts_both_parts_weights():
    rows = [("attn_in_1_m8_fused_k0", 32.0, 640.0)]  # k and v as one launch per layer, 20 µs each
    (label, calls, us, nbytes, gbps), = prof.site_bandwidth(rows, {"attn_in_1": 8_000_000}, {"attn_in_1": 64})
    assert (label, calls, us, nbytes) == ("attn_in_1 ×2", 32.0, 20.0, 16_000_000)
    assert gbps == pytest.approx(800.0)
    apart = prof.site_bandwidth([("attn_in_1_m8_fused_k0", 64.0, 640.0)], {"attn_in_1": 8_000_000},
                                {"attn_in_1": 64})
    assert apart[0][0] == "attn_in_1" and apart[0][3] == 8_000_000


def test_a_stacked_projection_counts_every_consumers_weights():
    """q, k and v stacked into one launch (attn_in's kernel; attn_in_1, the k and v parts, launch nothing): the row
    counts all three weights. Where k and v launch on their own, nothing is folded."""
    folds = {"attn_in_1": ("attn_in", 2 * 250_000)}
    stacked = prof.site_bandwidth([("attn_in_m1_fused_k0", 16.0, 160.0)], {"attn_in": 1_000_000, "attn_in_1": 250_000},
                                  None, folds)
    (label, calls, us, nbytes, gbps), = stacked
    assert (label, calls, us, nbytes) == ("attn_in +attn_in_1", 16.0, 10.0, 1_500_000)
    assert gbps == pytest.approx(150.0)
    apart = prof.site_bandwidth([("attn_in_m1_fused_k0", 16.0, 160.0), ("attn_in_1_m1_fused_k0", 32.0, 160.0)],
                                {"attn_in": 1_000_000, "attn_in_1": 250_000}, None, folds)
    assert {r[0]: r[3] for r in apart} == {"attn_in": 1_000_000, "attn_in_1": 250_000}


def test_part_bytes_folds_the_later_consumers_of_a_norm_site_without_its_weight_twice():
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    part_bytes, _, folds = prof._part_bytes(LlamaForCausalLM(cfg))
    # fp32: q 64x64 (+ the norm's 64), k and v 32x64 each, the norm weight counted once
    assert part_bytes["attn_in"] == 4 * (64 * 64 + 64)
    assert folds == {"attn_in_1": ("attn_in", 2 * 4 * 32 * 64)}


def test_decode_steps_leave_out_what_generate_launches_after_the_last_step():
    step = ["norm", "gemv", "add"] * 3 + ["lm_head", "argmax"]
    epilogue = ["cat", "copy", "gemv"]  # generate() assembling its output after the loop
    spans, exact = prof.decode_steps(_trace(["sdpa", "gemm"] * 9, step, 6) + _trace(epilogue, [], 0), steps=6)
    assert exact and [s.name for s in spans] == step * 6


def test_period_break_names_the_kernels_where_the_steps_stop_repeating():
    step = ["norm", "gemv", "add", "lm_head"]
    names = ["sdpa"] * 5 + step * 3 + ["norm", "copy", "add", "lm_head"] + step * 4  # one odd step
    why = prof.period_break(names, steps=6)
    assert "period of 4" in why and "'copy' where 4 later comes 'gemv'" in why
    assert prof.period_break(step * 6, steps=6).endswith("the whole trace repeats")


def test_decode_steps_set_aside_a_kernel_that_runs_between_some_steps():
    # the decode loop polls its finished rows every few steps: a reduction between two steps, not in them
    step = ["norm", "gemv", "add"] * 3 + ["lm_head", "argmax"]
    names = ["sdpa", "gemm"] * 9 + step * 3 + ["any"] + step * 3 + ["any"] + step * 2
    spans, exact = prof.decode_steps(_trace(names, [], 0), steps=8)
    assert exact and [s.name for s in spans] == step * 8
    assert prof.rare_kernels(_trace(names, [], 0), steps=8) == {"any"}


def test_decode_steps_are_not_one_layers_kernels_repeating_inside_a_step():
    # steps that differ (a copy in one of them), and more layers than profiled steps: the last step's layers
    # alone repeat `steps` times at one layer's period, which is not a step
    step = ["qkv", "attend", "o", "mlp"] * 6 + ["norm", "lm_head", "argmax"]
    names = ["copy"] * 5 + step * 2 + ["copy"] + step * 3
    spans, exact = prof.decode_steps(_trace(names, [], 0), steps=5)
    assert exact and len(spans) == 20  # a layer's period: 5 of the last step's 6 layers
    spans, exact = prof.decode_steps(_trace(names, [], 0), steps=5, min_period=6)
    assert not exact
