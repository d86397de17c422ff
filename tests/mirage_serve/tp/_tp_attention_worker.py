"""One rank of the TP=2 decode-attention check (test_tp_attention.py, torchrun, gloo, Triton's interpreter).

The tiny Llama of ``_tp_worker`` sharded by HF's plan, patched with the decode-attention kernels
(each rank holds 3 query heads and 1 kv head: ``shards.local_config``), decoded for 16 steps on
(a) HF's static cache and (b) the patch's own cache pool and graphed-step loop (``capture=False``:
the same buffers, eager), against the unsharded model's tokens. Writes ``<out>/rank<r>.json``.
"""
from __future__ import annotations

import json
import os
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported: the attention kernels run on CPU

import torch  # noqa: E402

import mirage_serve  # noqa: E402
from mirage_serve.decode import install_decode_graphs  # noqa: E402
from mirage_serve.decode.attention_fast import attention_verdicts  # noqa: E402
from mirage_serve.tp.hf_shard import init_distributed, shard_in_place  # noqa: E402
from mirage_serve.tp.shards import sharding_of  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _tp_worker import STEPS, tiny  # noqa: E402


def main(out_dir: str) -> None:
    rank, _ = init_distributed("cpu")
    model = tiny()
    ids = torch.randint(1, 130, (3, 5), generator=torch.Generator().manual_seed(7))
    kw = dict(max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        want = model.generate(ids, cache_implementation="static", **kw).tolist()
    shard_in_place(model, "cpu")
    mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(4,))
    res = {"local_heads": [sharding_of(model).config.num_attention_heads,
                           sharding_of(model).config.num_key_value_heads]}
    with torch.no_grad():
        res["hf_static_cache"] = model.generate(ids, cache_implementation="static", **kw).tolist() == want
        res["verdicts"] = sorted(set(attention_verdicts(model).values()))
        res["kernels"] = sorted(set(mirage_serve.attention_kernels(model).values()))
        runner = install_decode_graphs(model, capture=False, config=sharding_of(model).config)
        res["own_cache_loop"] = model.generate(ids, **kw).tolist() == want
        res["paths"] = dict(runner.paths)
        res["kv_heads_in_pool"] = int(next(iter(runner.pool._caches.values()))[0].layers[0].keys.shape[1])
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(res, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
