"""One rank of the CPU tensor-parallel check (run by test_tp_cpu.py under torchrun, gloo).

Writes ``<out>/rank<r>.json``: greedy tokens of the unsharded model, of HF's TP=2 model, of that
model patched (torch backend), and after unpatch; which forwards were swapped and restored; the
all-reduces our kernels ran; and the refusal of a world size that does not divide the kv heads.
"""
from __future__ import annotations

import json
import sys

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

import mirage_serve
from mirage_serve.patching.pipeline import PatchError, is_patched
from mirage_serve.tp import shards
from mirage_serve.tp.hf_shard import init_distributed, shard_in_place
from superopt.search import SearchBudget

STEPS = 16
BUDGET = SearchBudget(max_seconds=0.5)  # a short search: its winners are cached by the warm-up below


def warm_shards(model) -> dict:
    """Rank 1 searches the kernels of one rank's shard on a shard-shaped, unsharded model (as the GPU
    session does while rank 0 measures TP=1); the real sharded patch must then find them cached."""
    small = AutoModelForCausalLM.from_config(shards.shard_shaped_config(model.config, 2)).eval()
    with shards.simulated(2):
        rep = mirage_serve.patch(small, backend="torch", search_budget=BUDGET, batch_sizes=(4,))
    mirage_serve.unpatch(small)
    return {"searches": rep.searches, "patched": sum(s.patched for s in rep.sites)}


def one_rank_fails(model, rank: int, ids) -> dict:
    """Rank 1 cannot prepare layer 0's o_proj site: no rank may install it (rank 0's kernel would
    add the residual that rank 1's HF forward adds again)."""
    from mirage_serve.patching.prepare import Preparer, SiteError

    real_prepare = Preparer.prepare

    def failing(self, layer, site, sr):
        if rank == 1 and sr.layer == 0 and site.name == "attn_out":
            raise SiteError("injected failure on rank 1")
        return real_prepare(self, layer, site, sr)
    Preparer.prepare = failing
    try:
        report = mirage_serve.patch(model, backend="torch", search_budget=BUDGET, batch_sizes=(4,))
    finally:
        Preparer.prepare = real_prepare
    site = next(s for s in report.sites if s.layer == 0 and s.site == "attn_out")
    out = {"patched": sum(s.patched for s in report.sites), "reason": site.reason, "tokens": greedy(model, ids)}
    mirage_serve.unpatch(model)
    return out


def tiny(kv_heads: int = 2):
    # odd-ish sizes: head dim 12, 3 q heads / 1 kv head per rank, 67 MLP columns per rank
    cfg = LlamaConfig(vocab_size=130, hidden_size=72, intermediate_size=134, num_hidden_layers=2,
                      num_attention_heads=6, num_key_value_heads=kv_heads, max_position_embeddings=256)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # the same weights on every rank (shard_in_place slices them locally)
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (0.1 if p.dim() == 1 else 0.08) + (p.dim() == 1))
    return model


def greedy(model, ids):
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=STEPS, min_new_tokens=STEPS, do_sample=False, pad_token_id=0)
    return out[:, ids.shape[1]:].tolist()


def forwards(model) -> dict:
    return {n: id(m.__dict__["forward"]) for n, m in model.named_modules() if "forward" in m.__dict__}


def main(out_dir: str) -> None:
    rank, world = init_distributed("cpu")
    model = tiny()
    g = torch.Generator().manual_seed(7)
    prompts = {"b1": torch.randint(1, 130, (1, 6), generator=g), "b3": torch.randint(1, 130, (3, 5), generator=g)}
    import transformers
    res = {"rank": rank, "world": world, "transformers": transformers.__version__, "unsharded": {k: greedy(model, v) for k, v in prompts.items()}}
    short = prompts["b3"][:, -1:]
    with torch.no_grad():
        full_logits = model(short).logits
    shard_in_place(model, "cpu")
    res["hf_tp"] = {k: greedy(model, v) for k, v in prompts.items()}
    with torch.no_grad():
        tp_logits = model(short).logits
    before = forwards(model)
    if rank == 1:
        res["warm"] = warm_shards(model)
    torch.distributed.barrier()

    calls = {"reduced": 0}
    run = shards.Reduced.run

    def counted(self, x, r=None):
        calls["reduced"] += 1
        return run(self, x, r)
    shards.Reduced.run = counted
    report = mirage_serve.patch(model, backend="torch", search_budget=BUDGET, batch_sizes=(4,))
    res["counts"] = {k: getattr(report, k) for k in ("searches", "cache_hits", "programs")}
    res["patched_sites"] = sum(s.patched for s in report.sites)
    res["sites"] = len(report.sites)
    res["reasons"] = sorted({s.reason for s in report.sites if s.reason})
    res["note"] = report.note
    with torch.no_grad():
        got = model(short).logits
    res["logits_err_vs_unsharded"] = ((got - full_logits).norm() / full_logits.norm()).item()
    res["reduced_per_forward"] = calls["reduced"]
    res["patched"] = {k: greedy(model, v) for k, v in prompts.items()}
    res["unpatched_ok"] = mirage_serve.unpatch(model)
    shards.Reduced.run = run
    res["forwards_restored"] = forwards(model) == before
    with torch.no_grad():
        res["logits_restored_exactly"] = bool(torch.equal(model(short).logits, tp_logits))
    res["restored"] = {k: greedy(model, v) for k, v in prompts.items()}

    res["one_rank_fails"] = one_rank_fails(model, rank, prompts["b3"])

    odd = tiny(kv_heads=3)  # 3 kv heads cannot be split over 2 ranks
    shard_in_place(odd, "cpu")
    odd_before = forwards(odd)
    try:
        mirage_serve.patch(odd, backend="torch", search_budget=0)
        res["refusal"] = None
    except PatchError as e:
        res["refusal"] = str(e)
    res["refused_untouched"] = forwards(odd) == odd_before and not is_patched(odd)
    with open(f"{out_dir}/rank{rank}.json", "w") as f:
        json.dump(res, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
