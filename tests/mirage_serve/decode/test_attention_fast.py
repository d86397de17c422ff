"""The decode-attention fast path: kernels against float64, families end to end (Triton interpreter)."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Gemma2Config, Gemma3TextConfig, LlamaConfig, Qwen3Config

from mirage_serve.decode.attention_fast import fused_qk_norm, unsupported
from mirage_serve.decode.attention_launch import BLOCK_N, LaunchPlan, split_plan

from .attention_cases import FAMILIES, KERNEL_CASES

ROOT = Path(__file__).resolve().parents[3]
TOL = {"float32": 1e-5, "float16": 2e-3}  # docs/conventions.md tolerance table


@pytest.fixture(scope="module")
def interp() -> dict:
    # interpreter processes apart from this one (TRITON_INTERPRET must precede triton's import), one a core, each
    # running every n-th case: the cases take minutes in all, and this process only waits for them
    parts = max(1, min(4, len(os.sched_getaffinity(0))))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT), **({"OMP_NUM_THREADS": "1"} if parts > 1 else {}))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.mirage_serve.decode.attention_interp_run", str(i),
                               str(parts)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(parts)]
    result = {}
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        result.update(json.loads(out.strip().splitlines()[-1]))
    return result


@pytest.mark.parametrize("dtype", TOL)
@pytest.mark.parametrize("case", KERNEL_CASES)
def test_kernels_match_float64(interp, case, dtype):
    r = interp[f"kernel/{case}/{dtype}"]
    assert not isinstance(r, str), r
    for what in ("out", "key_slot", "value_slot"):
        assert math.isfinite(r[what]) and r[what] <= TOL[dtype], f"{case} {dtype} {what}: {r[what]:.3e}"
    assert r["others_untouched"], "a cache slot other than the new token's was written"
    assert r["advanced"], "the cache's length counter did not advance by one"


def _decoded_like_hf(interp, name: str) -> dict:
    """The interpreter run's result of family case ``name``, checked: HF's greedy tokens and logits, every
    layer's first-use check passed, 15 decode steps per layer on the fast path (the first is the checked step)."""
    r = interp[f"family/{name}"]
    assert not isinstance(r, str), r
    assert r["tokens_equal"], f"{name}: greedy tokens differ from the model without the fast path"
    assert r["logits_err"] <= TOL["float32"], r
    assert r["verdicts"] and all(v == "ok" for v in r["verdicts"].values()), r["verdicts"]
    assert r["fast_calls"] == 15 * len(r["verdicts"]), r
    return r


@pytest.mark.parametrize("name", list(FAMILIES) + ["llama_patched", "llama_patched_residual", "llama_unpadded",
                                                   "qwen3_patched", "granite_traced", "stablelm_traced", "gemma2_patched",
                                                   "phi3_window_patched", "olmo2_patched"])
def test_family_decodes_hf_tokens_through_the_fast_path(interp, name):
    r = _decoded_like_hf(interp, name)
    assert len(r["kernel_layers"]) == len(r["verdicts"]), r["kernel_layers"]
    # SDPA's boolean mask, or eager attention's additive one (Gemma-2 runs eager attention)
    assert r["masks"] == (["float32"] if name.startswith(("qwen2_eager_mask", "gemma2")) else ["bool"]), r["masks"]
    # per-head q/k RMSNorms run inside the kernel: Qwen3's, and Gemma-3's (1 + weight) form
    assert r["qk_norm_fused"] == (len(r["verdicts"]) if name.startswith(("qwen3", "gemma3")) else 0), r


@pytest.mark.parametrize("name", ["llama_searched", "gemma2_searched", "qwen3_searched"])
def test_patch_runs_searched_attention_with_hf_tokens(interp, name):
    # patch()'s default: each shape's attention program searched on the first decode step, built with the cache
    # writes in place and run (no GPU to time the hand-written reference against it): GQA; Gemma-2's softcap,
    # eager float mask and sliding layers; Qwen3's q/k norms inside the program (head dim 8: the RoPE halves
    # join into a tile padded to 16)
    r = _decoded_like_hf(interp, name)
    assert r["kernels"] == ["searched"], r["why"]
    assert all(w.startswith(("searched: μGraph searched: ", "searched: μGraph re-instantiated"))
               and "generated kernels" in w for w in r["why"]), r["why"]
    assert r["qk_norm_fused"] == (len(r["verdicts"]) if name.startswith("qwen3") else 0), r
    assert r["unpatched_identical"], r


def test_sliding_layers_with_a_full_window_keep_their_forward(interp):
    r = interp["family/gemma3_small_window"]
    assert not isinstance(r, str), r
    assert r["tokens_equal"] and r["logits_err"] <= TOL["float32"], r
    ok = [k for k, v in r["verdicts"].items() if v == "ok"]
    assert len(ok) == 1 and ok[0].endswith("layers.1.self_attn"), r["verdicts"]  # the one full-attention layer
    assert r["kernel_layers"] == [1], r["kernel_layers"]  # what a decode loop's capture checks (fast_loop)
    assert all(v == "not checked yet" for k, v in r["verdicts"].items() if k not in ok), r["verdicts"]
    assert r["fast_calls"] == 15, r


def test_unpatch_removes_the_attention_path(interp):
    r = interp["family/llama_patched"]
    assert r["unpatched_clean"], "a forward patch() set is still on a module after unpatch()"
    assert r["unpatched_identical"], "after unpatch(), tokens or logits differ from the model before patch()"


def test_wrong_kernel_is_refused_at_first_use(interp):
    r = interp["family/llama_mutant"]
    assert not isinstance(r, str), r
    assert r["tokens_equal"] and r["logits_err"] == 0.0, r  # the checked step kept the original's result
    assert all("differs from the original forward" in v for v in r["verdicts"].values()), r["verdicts"]
    assert r["fast_calls"] == len(r["verdicts"]), "a refused module ran the fast path again"


@pytest.mark.parametrize("rows,kv,cap,sms", [(1, 8, 256, 132), (16, 8, 32768, 132), (1, 2, 100, 132),
                                             (3, 1, 1000, 8), (8, 8, 64, 132)])
def test_split_plan_covers_the_cache_in_whole_tiles(rows, kv, cap, sms):
    splits, chunk = split_plan(rows, kv, cap, sms)
    assert chunk % BLOCK_N == 0 and splits * chunk >= cap > (splits - 1) * chunk
    tiles = -(-cap // BLOCK_N)
    assert splits == tiles or rows * kv * splits >= 2 * sms  # fills two waves unless out of tiles


@pytest.mark.parametrize("rows,kv,cap,one_tile", [(8, 8, 384, True), (8, 8, 1024, False), (1, 8, 4096, False),
                                                  (16, 8, 384, False), (1, 2, 100, True), (4, 8, 1024, True),
                                                  (1, 8, 2048, True)])
def test_split_plan_cuts_one_tile_a_split_where_it_can(rows, kv, cap, one_tile):
    sms = 132
    splits, chunk = split_plan(rows, kv, cap, sms)
    assert (chunk == BLOCK_N) == one_tile, (splits, chunk)
    tiles = -(-cap // BLOCK_N)  # the rule, restated: ≤ 16 splits in ≤ 4 waves, or the two-wave plan's own cut
    assert ((tiles <= 16 and rows * kv * tiles <= 4 * sms) or rows * kv * tiles <= 2 * sms) == one_tile


def test_the_kernel_cases_cover_one_tile_slices_and_longer_ones():
    for sms in (8, 132):  # Triton's interpreter, an H100
        one_tile = {split_plan(c[0], c[2], c[4], sms)[1] == BLOCK_N for c in KERNEL_CASES.values()}
        assert one_tile == {True, False}, sms


def test_split_plan_without_the_one_tile_rule_fills_two_waves():
    assert split_plan(8, 8, 384, 132, LaunchPlan(one_tile_splits=0)) == (3, 128)  # 192 programs, two tiles each
    assert split_plan(8, 8, 384, 132) == (6, 64)


def _attn(config):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_config(config).model.layers[0].self_attn


def test_unsupported_attention_is_named():
    llama = LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2)
    assert unsupported(_attn(llama), llama) is None
    gemma2 = Gemma2Config(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    assert unsupported(_attn(gemma2), gemma2) is None  # softcapping and sliding windows are handled
    from transformers import AutoConfig
    olmo2 = AutoConfig.for_model("olmo2", vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                 num_attention_heads=4, num_key_value_heads=2)
    assert unsupported(_attn(olmo2), olmo2) is None  # its whole-projection q/k norms run before the kernels
    odd = _attn(olmo2)
    odd.k_norm = torch.nn.Identity()  # a q_norm without a k_norm of either span
    assert "q_norm / k_norm" in unsupported(odd, olmo2)
    assert "no q/k/v" in unsupported(torch.nn.Linear(2, 2), llama)


def test_qk_norm_is_fused_in_hf_usual_and_gemma3_forms_and_the_model_dtype():
    qwen3 = Qwen3Config(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, rms_norm_eps=1e-5)
    attn = _attn(qwen3)
    with torch.no_grad():
        attn.q_norm.weight.uniform_(0.5, 1.5)
    q_w, k_w, eps, form = fused_qk_norm(attn)
    assert q_w is attn.q_norm.weight and k_w is attn.k_norm.weight and eps == 1e-5 and form == 1
    attn.to(torch.bfloat16)
    assert fused_qk_norm(attn) is not None
    attn.k_norm.float()  # float32 norm weights in a bf16 model: HF returns float32 there, the kernel would not
    assert fused_qk_norm(attn) is None
    gemma3 = Gemma3TextConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8)
    gemma3_attn = _attn(gemma3)
    with torch.no_grad():
        gemma3_attn.q_norm.weight.normal_(0.0, 0.3)
    assert fused_qk_norm(gemma3_attn)[2:] == (gemma3.rms_norm_eps, 2)  # scales by 1 + weight, in float32
    gemma3_attn.k_norm.eps = 1e-3
    assert fused_qk_norm(gemma3_attn) is None  # one eps for both
    assert fused_qk_norm(_attn(LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=48,
                                           num_hidden_layers=1, num_attention_heads=4))) is None


def test_find_attention_takes_the_child_with_hf_attention_attributes():
    from transformers import AutoConfig

    from mirage_serve.decode.attention_fast import find_attention

    def layer0(model_type, **extra):
        cfg = AutoConfig.for_model(model_type, vocab_size=32, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, **extra)
        from transformers import AutoModelForCausalLM
        return AutoModelForCausalLM.from_config(cfg).model.layers[0], cfg

    assert find_attention(*layer0("granite")) == "self_attn"
    assert find_attention(*layer0("phi")) is None  # Phi-2: a `dense` output projection the kernels do not know
