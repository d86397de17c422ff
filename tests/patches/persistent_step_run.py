"""A patched model's recorded decode step as persistent launches, in Triton's interpreter.

Run as ``python -m tests.patches.persistent_step_run`` in its own process (TRITON_INTERPRET must be set before
triton is imported; it also lets ``patch(backend="triton")`` and the decode-attention kernels run on a CPU). A
2-layer Llama-shaped model from a config, patched at one row with the search (kernels alone: no CUDA graphs) and
the hand-written decode attention on HF's static cache. One greedy decode step warms it (the attention's first-use
checks), the next is recorded (``superopt.runtime.compiled.recording``; the attention marks itself). Its site
kernels then run again one by one, as one persistent launch, and as one persistent launch per segment between
attention launches (``superopt.runtime.persistent``). Prints one JSON line: the recording, the launches and their
waits, and the largest difference of each persistent run's final buffers from the one-by-one run's.
"""
from __future__ import annotations

import json
import os

os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, LlamaConfig  # noqa: E402

import mirage_serve  # noqa: E402
from mirage_serve.options import PatchOptions  # noqa: E402
from superopt.runtime.compiled import recording  # noqa: E402
from superopt.runtime.persistent import PersistentRun, segments  # noqa: E402


def main() -> dict:
    cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    mirage_serve.patch(model, backend="triton", batch_sizes=(1,), cuda_graphs=False, decode_attention=True,
                       options=PatchOptions(attention="hand-written"))
    ids = torch.randint(1, cfg.vocab_size, (1, 6))
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=2, min_new_tokens=2, do_sample=False,
              pad_token_id=0, cache_implementation="static", disable_compile=True)
    with torch.inference_mode():
        model.generate(ids, **kw)  # the first decode step checks each attention module against its own forward
        with recording() as recorded:  # the prefill runs the original modules: only the decode step is recorded
            model.generate(ids, **kw)
        parts = segments(recorded)
        calls = [c for part in parts for c in part]
        finals = {t.data_ptr(): t for cg, inputs in calls for t in cg.kernel_launches(*inputs)[1]}
        for cg, inputs in calls:  # the step's site kernels one by one, on the recorded inputs
            cg(*inputs)
        want = {p: t.clone() for p, t in finals.items()}

        def diff(runs) -> float:
            for t in finals.values():
                t.fill_(float("nan"))
            for run in runs:
                run()
            return max(float((finals[p].double() - w.double()).abs().max()) for p, w in want.items())
        whole = PersistentRun(calls, programs=2)
        seg_runs = [PersistentRun(part, programs=2) for part in parts]
        return {"recorded": [cg.graph.name if cg is not None else what for cg, what in recorded],
                "segments": [len(p) for p in parts], "launches": whole.launches, "bodies": len(whole.bodies),
                "waits": whole.dependencies, "whole_diff": diff([whole]), "segments_diff": diff(seg_runs)}


if __name__ == "__main__":
    print(json.dumps(main()))
