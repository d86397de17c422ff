"""GPU check of families with no adapter: sites from the traced layer, greedy tokens and decode speed.

    python benchmarks/no_adapter_gpu.py --out $OUT/no_adapter.json [--families olmo2,phi] [--search-seconds 20]

Each family (olmo2, granite, stablelm, starcoder2, phi, gpt_neox, smollm3, glm4, cohere) is built
from a small config of real proportions (hidden 1024, 4 layers, bf16, weights normal(0, 0.02)),
and patched with the default GPU path (triton backend, CUDA-graph decode). Per family it records
the sites and why any stayed original, whether greedy tokens (16 steps, b1 and b3 left padded)
match the unpatched model, and the decode ms/step of both (HF eager, dynamic cache, same run).
"""
from __future__ import annotations

import argparse
import json
import time

FAMILIES = ("olmo2", "granite", "stablelm", "starcoder2", "phi", "gpt_neox", "smollm3", "glm4", "cohere")
CONFIG = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=4,
              num_attention_heads=16, num_key_value_heads=4, pad_token_id=0)
STEPS = 16


def _greedy(model, ids, mask):
    import torch
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    out = model.generate(ids, attention_mask=mask, max_new_tokens=STEPS, min_new_tokens=STEPS,
                         do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    return out, (time.perf_counter() - t0) * 1e3 / STEPS


def run_family(model_type: str, search_seconds: float) -> dict:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    import mirage_serve
    from superopt.search import SearchBudget

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **CONFIG)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).to("cuda").eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.02)
    g = torch.Generator().manual_seed(7)
    ids1 = torch.randint(1, cfg.vocab_size, (1, 24), generator=g).cuda()
    ids3 = torch.randint(1, cfg.vocab_size, (3, 24), generator=g).cuda()
    mask3 = torch.ones_like(ids3)
    for i, pad in enumerate((0, 9, 5)):  # left padding
        ids3[i, :pad], mask3[i, :pad] = 0, 0
    ref = {b: _greedy(model, ids, m) for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items()}
    ref = {b: _greedy(model, ids, m) for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items()}  # warm
    t0 = time.perf_counter()
    report = mirage_serve.patch(model, batch_sizes=(1, 4), search_budget=SearchBudget(max_seconds=search_seconds))
    patch_s = time.perf_counter() - t0
    got = {b: _greedy(model, ids, m) for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items()}
    got = {b: _greedy(model, ids, m) for b, (ids, m) in {1: (ids1, None), 3: (ids3, mask3)}.items()}  # warm
    row = {
        "family": model_type, "gpu": torch.cuda.get_device_name(), "patch_s": round(patch_s, 2),
        "supported": report.supported, "note": report.note,
        "sites": [{"layer": s.layer, "site": s.site, "patched": s.patched, "source": s.source,
                   "kernels": s.kernels, "reason": s.reason, "check_error": s.check_error}
                  for s in report.sites if s.layer == 0],
        "sites_patched": sum(s.patched for s in report.sites), "sites_total": len(report.sites),
    }
    for b in (1, 3):
        row[f"b{b}_greedy_identical"] = bool(torch.equal(got[b][0], ref[b][0]))
        row[f"b{b}_first_diff_step"] = next((int(i) for i in range(got[b][0].shape[1])
                                             if not torch.equal(got[b][0][:, i], ref[b][0][:, i])), None)
        row[f"b{b}_ms_per_step_hf"] = round(ref[b][1], 3)
        row[f"b{b}_ms_per_step_patched"] = round(got[b][1], 3)
    mirage_serve.unpatch(model)
    return row


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="JSON file for the rows")
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--search-seconds", type=float, default=20.0)
    args = ap.parse_args(argv)
    rows = []
    for fam in args.families.split(","):
        try:
            row = run_family(fam, args.search_seconds)
        except Exception as e:  # one family failing must not hide the others' rows
            row = {"family": fam, "error": f"{type(e).__name__}: {e}"}
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k not in ("sites", "note")}), flush=True)
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
