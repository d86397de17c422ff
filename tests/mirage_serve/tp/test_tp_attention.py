"""TP=2 decode attention on CPU: the kernels and the owned KV cache use each rank's head counts."""
from __future__ import annotations

import json
import os
from pathlib import Path

from mirage_serve.tp.launch import launch

WORKER = Path(__file__).with_name("_tp_attention_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def test_decode_attention_on_shards_matches_unsharded(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MIRAGE_SERVE_CACHE_DIR=str(tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    assert launch(2, [str(WORKER), str(tmp_path)], env=env, timeout=300) == 0
    for r in range(2):
        res = json.loads((tmp_path / f"rank{r}.json").read_text())
        assert res["local_heads"] == [3, 1]
        assert res["hf_static_cache"] and res["verdicts"] == ["ok"]  # our attention kernels ran and agreed
        # patch()'s default attention path at the rank's head counts: the attention program built in place on the
        # shard's cache (search_budget=0 keeps it as library ops; the searched kernels are the families' tests)
        assert len(res["kernels"]) == 1 and res["kernels"][0].startswith(
            "searched: μGraph the program as library ops"), res["kernels"]
        assert res["own_cache_loop"] and res["paths"].get("fast") == 1  # the graphed-step loop, eager on CPU
        assert res["kv_heads_in_pool"] == 1
