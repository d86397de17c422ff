"""A patched model's recorded decode step as one persistent launch, in Triton's interpreter.

Run as ``python -m tests.patches.persistent_step_run`` in its own process (TRITON_INTERPRET must be set before
triton is imported; it also lets ``patch(backend="triton")`` run on a CPU). A 2-layer Llama-shaped model from a
config, patched at one row with the search (kernels alone: no CUDA graphs); one greedy decode step recorded
(``superopt.runtime.compiled.recording``); its site kernels run again one by one, then as one persistent launch
(``superopt.runtime.persistent``). Prints one JSON line: the programs recorded, the launches and their waits, and
the largest difference between the two runs' final buffers.
"""
from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

import mirage_serve  # noqa: E402
from superopt.runtime.compiled import recording  # noqa: E402
from superopt.runtime.persistent import PersistentRun  # noqa: E402


def main() -> dict:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    mirage_serve.patch(model, backend="triton", batch_sizes=(1,), cuda_graphs=False)
    ids = torch.randint(1, cfg.vocab_size, (1, 6))
    with torch.inference_mode():
        with recording() as calls:  # the prefill runs the original modules: only the decode step is recorded
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2,
                           do_sample=False, pad_token_id=0)
        finals = {t.data_ptr(): t for cg, inputs in calls for t in cg.kernel_launches(*inputs)[1]}
        for cg, inputs in calls:  # the step's site kernels one by one, on the recorded inputs
            cg(*inputs)
        want = {p: t.clone() for p, t in finals.items()}
        run = PersistentRun(calls, programs=2)
        for t in finals.values():
            t.fill_(float("nan"))
        run()
        diff = max(float((finals[p].double() - w.double()).abs().max()) for p, w in want.items())
    return {"programs": [cg.graph.name for cg, _ in calls], "launches": run.launches, "bodies": len(run.bodies),
            "waits": run.dependencies, "max_abs_diff": diff}


if __name__ == "__main__":
    print(json.dumps(main()))
