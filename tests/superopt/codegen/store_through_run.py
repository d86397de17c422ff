"""Run searched decode-attention μGraphs (``UGRAPHS``: the RoPE kernel one block, or a block per kv head) in
Triton's CPU interpreter with its caches in place, the new key stored and the new value copied by the RoPE kernel
(``codegen.store_through``), and with plain library scatters; then with the position also the call counter the
last kernel advances (``codegen.counted``), as a decode step hands in its cache's length; print one JSON line
comparing them.

Run as ``python -m tests.superopt.codegen.store_through_run`` in its own process (TRITON_INTERPRET must
be set before triton is imported).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

if __name__ == "__main__":
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from superopt.ir import from_text  # noqa: E402
from superopt.runtime import compile_graph  # noqa: E402

# the search's best for decode_layer_attention_program(2, 4, 2, 16, 32) and (2, 8, 4, 64, 32), float32
# (SearchBudget(max_block_ops=40, max_seconds=60)), kept as text so no test searches for them
# -> the positions written: the first slot, one inside, the last; the second graph (its tile offsets by program
# id are what it adds) at the last slot only, to keep the interpreter's time down
UGRAPHS = {"decode_attention_b2_q4_kv2_d16_L32": (0, 17, 31), "decode_attention_b2_q8_kv4_d64_L32": (31,)}


def inputs(g, seed: int, pos: int, device: str) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    xs = []
    for v in g.inputs:
        if v.name == "pos":
            xs.append(torch.tensor([pos]))
        elif v.name == "mask":  # attend to the slots up to the position
            m = torch.full(v.type.shape, float("-inf"))
            m[..., :pos + 1] = 0.0
            xs.append(m)
        else:
            xs.append(torch.randn(v.type.shape, generator=gen))
    return [x.to(device) for x in xs]


def _others(cache: torch.Tensor, pos: int) -> torch.Tensor:
    return torch.cat([cache[:, :, :pos], cache[:, :, pos + 1:]], 2)


def compare(device: str, name: str) -> dict:
    """μGraph ``name`` lowered (plain and bound calls) against it with library scatters, on ``device``."""
    g = from_text((Path(__file__).resolve().parent / "ugraphs" / f"{name}.txt").read_text())
    names = [v.name for v in g.inputs]
    plain = compile_graph(g, device=device)            # functional scatters: the caches copied, then written
    lowered = compile_graph(g, device=device, in_place=("k_cache", "v_cache"))
    bound = lowered.bind([None] * len(names))
    counted = compile_graph(g, device=device, in_place=("k_cache", "v_cache"), counter="pos")
    # a counter the last kernel reads (the mask; the counter itself is another tensor): counted after the graph
    after = compile_graph(g, device=device, in_place=("k_cache", "v_cache"), counter="mask")
    out = {"stored": [s.cache for s in lowered.module.stored], "launches": [plain.launches, lowered.launches],
           "counted_launches": [counted.launches, after.launches], "steps": [], "counted": []}
    for step, pos in enumerate(UGRAPHS[name]):
        xs = inputs(g, step, pos, device)
        want = [t.clone() for t in plain(*[x.clone() for x in xs])]
        for how, run in (("call", lowered), ("bound", bound)):
            mine = [x.clone() for x in xs]
            caches = [mine[names.index(n)] for n in ("k_cache", "v_cache")]
            got = run(*mine)
            out["steps"].append({
                "pos": pos, "how": how,
                "outputs_equal": all(torch.equal(a, b) for a, b in zip(got, want)),
                "caches_are_inputs": got[1] is caches[0] and got[2] is caches[1],
                "caches_written": all(torch.equal(c, w) for c, w in zip(caches, want[1:])),
                "other_slots_kept": all(torch.equal(_others(c, pos), _others(xs[names.index(n)], pos))
                                        for c, n in zip(caches, ("k_cache", "v_cache"))),
            })
        for how, graph in (("call", counted), ("bound", counted.bind([None] * len(names))), ("after", after)):
            mine = [x.clone() for x in xs]
            caches = [mine[names.index(n)] for n in ("k_cache", "v_cache")]
            count = mine[names.index("pos")] if graph is not after else torch.tensor([pos], device=device)
            got = graph(*mine, count=count) if how != "bound" else graph(*mine, count)
            out["counted"].append({
                "pos": pos, "how": how,
                "outputs_equal": all(torch.equal(a, b) for a, b in zip(got, want)),
                "caches_written": all(torch.equal(c, w) for c, w in zip(caches, want[1:])),
                "advanced": int(count) == pos + 1,
            })
    xs = inputs(g, 9, 3, device)  # a cache that is not contiguous: the kernel's offsets would miss it, so refused
    i = names.index("k_cache")
    xs[i] = xs[i].transpose(2, 3).contiguous().transpose(2, 3)
    try:
        lowered(*xs)
        out["strided_refused"] = ""
    except ValueError as e:
        out["strided_refused"] = str(e)
    return out


def main() -> None:
    print(json.dumps({name: compare("cpu", name) for name in UGRAPHS}))


if __name__ == "__main__":
    main()
