"""patch() at TP=2 on CPU: two gloo ranks run a tiny Llama sharded by HF's tp_plan, torch backend.

The worker (``_tp_worker.py``, started through ``mirage_serve.tp.launch`` as the CLI starts its
ranks) checks greedy tokens against the unsharded model for 16 steps at batch 1 and 3, that the
row-wise kernels all-reduce, that unpatch restores HF's TP forwards and bit-identical logits, and
that a world size which does not divide the kv heads is refused with the model untouched, and that
kernels searched for a shard-shaped model serve the sharded one from the cache.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mirage_serve.tp.launch import launch, torchrun_line
from mirage_serve.tp.safety import MULTICAST_OFF, MulticastError, assert_multicast_off

WORKER = Path(__file__).with_name("_tp_worker.py")
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp")
    env = dict(os.environ, OMP_NUM_THREADS="1", MIRAGE_SERVE_CACHE_DIR=str(out / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    for k in MULTICAST_OFF:  # the launcher must set them itself
        env.pop(k, None)
    assert launch(2, [str(WORKER), str(out)], env=env, timeout=300) == 0
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def test_greedy_tokens_match_unsharded_model(ranks):
    for res in ranks:
        assert res["world"] == 2
        assert res["hf_tp"] == res["unsharded"]  # HF's own TP=2 path, the reference of what we shard
        assert res["patched"] == res["unsharded"]
        assert len(res["patched"]["b3"]) == 3 and all(len(t) == 16 for t in res["patched"]["b3"])
    assert ranks[0]["patched"] == ranks[1]["patched"]


def test_every_site_patched_and_row_wise_kernels_all_reduce(ranks):
    for res in ranks:
        assert res["patched_sites"] == res["sites"] == 8, res["reasons"]
        assert res["reduced_per_forward"] == 4  # o_proj and down_proj of 2 layers
        assert res["logits_err_vs_unsharded"] < 1e-5  # fp32 row of the tolerance table
        assert "tensor parallel: rank" in res["note"]
        # the residual add moved into o_proj / down_proj (rank 0 adds it, the all-reduce sums it in)
        assert "residual adds: in the kernels of mlp.down_proj, self_attn.o_proj in 2/2 layers" in res["note"]


def test_shard_kernels_searched_once_and_keyed_by_world_size(ranks):
    """Rank 1 searched the shard's programs on a shard-shaped model (``shards.simulated``); both ranks'
    real sharded patch then found every program in the shared cache: the keys match."""
    assert ranks[1]["warm"]["searches"] > 0 and ranks[1]["warm"]["patched"] == 8
    for res in ranks:
        assert res["counts"]["searches"] == 0
        assert res["counts"]["cache_hits"] == res["counts"]["programs"] > 0


def test_unpatch_restores_hf_tp_model(ranks):
    for res in ranks:
        assert res["unpatched_ok"] and res["forwards_restored"] and res["logits_restored_exactly"]
        assert res["restored"] == res["unsharded"]


def test_a_site_one_rank_could_not_prepare_stays_original_on_all(ranks):
    for res in ranks:
        got = res["one_rank_fails"]
        assert got["patched"] == 7 and got["tokens"] == res["unsharded"]["b3"]
    assert ranks[0]["one_rank_fails"]["reason"].startswith("prepared on this rank but not on every rank")
    assert ranks[1]["one_rank_fails"]["reason"] == "injected failure on rank 1"


def test_world_size_not_dividing_heads_is_refused_untouched(ranks):
    for res in ranks:
        assert res["refusal"].startswith("tensor-parallel world size 2 does not divide the kv heads 3")
        assert "\n" not in res["refusal"]
        assert res["refused_untouched"]


def test_multicast_guard():
    with pytest.raises(MulticastError, match="NCCL_NVLS_ENABLE"):
        assert_multicast_off({"TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"})
    assert_multicast_off(dict(MULTICAST_OFF))
    line = torchrun_line(2, ["-m", "mirage_serve.cli", "bench", "M"])
    assert all(f"{k}={v}" in line for k, v in MULTICAST_OFF.items()) and "--nproc-per-node=2" in line
