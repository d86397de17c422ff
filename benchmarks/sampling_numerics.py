"""Why the bench's sampling check fails on Gemma-2 / Gemma-3 / Phi-3 (issue 28), measured on the CPU.

    PYTHONPATH=$PWD python benchmarks/sampling_numerics.py own Gemma-2-2B          # HF bf16 vs float32
    PYTHONPATH=$PWD python benchmarks/sampling_numerics.py sites Gemma-2-2B --layers-at 1,13,25
    PYTHONPATH=$PWD python benchmarks/sampling_numerics.py e2e Gemma-3-1B --steps 8 [--batch 8]

Every run builds the registry model at its real config (vocabulary cut to ``--vocab``, layers to
``--layers`` if given) with the bench's weights (``bench_load.random_init_``: normal(0, 0.02) on
every parameter, so Gemma's (1 + w) norms sit near 1 and Llama's w near 0), in bf16.

* ``own``: HF's eager bf16 logits against a float32 run of the same weights, over a prompt, and the
  hidden states' error per layer: the error any bf16 implementation starts from.
* ``sites``: per site part of the chosen layers, on the activations the model really feeds it, the
  shipped sm90 μGraph (``kernels_cache/``, by program digest) run as the Triton backend computes it
  (``triton_numerics`` below), HF's bf16 module, and both against the module in float64.
* ``e2e``: ``patch()`` with those μGraphs under Triton numerics, then ``bench_sampling``'s check
  against eager, and both runs against the float32 reference of eager's tokens.

Triton numerics (``superopt/codegen/triton.py``'s docstring, checked against the rendered source of
Gemma-2's q kernel): inside a kernel every op computes in float32; a ``cast`` to bf16 rounds
through it; dot operands are taken in the kernel's narrow dtype; stores round to the output dtype.
Library ops run as torch calls in their declared dtypes. The torch Domain of the CPU backend rounds
every block value to its declared dtype instead, so it is not what the GPU computes.
"""
from __future__ import annotations

import argparse
import copy
import glob
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

import mirage_serve
from mirage_serve import backends, bench_sampling, optimize, registry
from mirage_serve.bench_load import random_init_
from mirage_serve.options import PatchOptions
from mirage_serve.patching.pipeline import _adapters
from mirage_serve.patching.sites import NormSite, find_layers, site_module, site_parts
from superopt.interp.evaluate import _run_block, apply_op
from superopt.interp.torch_domain import TORCH_DTYPES, TorchDomain
from superopt.ir import digest, from_text
from superopt.lax.extract import extract

SHIPPED = Path(__file__).resolve().parents[1] / "kernels_cache"
NARROW = (torch.bfloat16, torch.float16)


class TritonDomain(TorchDomain):
    """Block values in float32; casts to fp16/bf16 round; dot operands in the model's dtype."""

    def __init__(self, narrow: torch.dtype = torch.bfloat16):
        super().__init__("cpu")
        self.narrow = narrow

    def const(self, value, dtype):
        return torch.tensor(value, dtype=torch.float32)  # tl.full(..., tl.float32)

    def cast(self, x, dtype):
        t = TORCH_DTYPES[dtype]
        return x.to(t).float() if t in NARROW else x.float()

    def matmul(self, a, b):  # tl.dot on narrow operands, float32 accumulation
        return torch.matmul(a.to(self.narrow).float(), b.to(self.narrow).float())


def triton_numerics(graph, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """``graph`` on ``inputs`` as the Triton backend computes it (see the module docstring)."""
    env = dict(zip((v.name for v in graph.inputs), inputs))
    block, library = TritonDomain(), TorchDomain("cpu")
    for n in graph.nodes:
        args = [env[a] for a in n.args]
        if n.op == "customized":
            for v, r in zip(n.outs, _run_block(n.block, [a.float() for a in args], block)):
                env[v.name] = r.to(TORCH_DTYPES[v.type.dtype])  # the store rounds
        else:
            env[n.out.name] = apply_op(n, args, library)
    return [env[o] for o in graph.outputs]


def shipped() -> dict[tuple[str, str], Path]:
    """(program digest, bucket) -> shipped entry folder."""
    out = {}
    for f in glob.glob(str(SHIPPED / "*" / "meta.json")):
        k = json.loads(Path(f).read_text())["key"]
        out[(k["program_digest"], k["bucket"])] = Path(f).parent
    return out


def build(name: str, vocab: int, layers: int | None):
    facts = dict(registry.get(name).config, vocab_size=vocab)
    if layers:
        facts["num_hidden_layers"] = layers
        if facts.get("layer_types"):
            facts["layer_types"] = facts["layer_types"][:layers]
    for k in ("pad_token_id", "bos_token_id", "eos_token_id"):
        if (facts.get(k) or 0) >= vocab:
            facts[k] = 1
    model = AutoModelForCausalLM.from_config(registry.hf_config(facts), dtype=torch.bfloat16).eval()
    random_init_(model, 0)
    return model


def rel(a, b) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def own(model, ids) -> None:
    with torch.no_grad():
        low = model(ids, output_hidden_states=True)
        wide = copy.deepcopy(model).float()(ids, output_hidden_states=True)
    print(f"logits, HF bf16 vs float32: {rel(low.logits, wide.logits):.3e}")
    print("hidden states per layer:", " ".join(f"{rel(a, b):.2e}" for a, b in zip(low.hidden_states, wide.hidden_states)))


def sites(model, ids, at: list[int], rows: int) -> None:
    family = _adapters()[0](model.config.model_type)
    _, layers = find_layers(model, family)
    seen, hooks = {}, []
    for i in at:
        for site in family.sites:
            head = layers[i].get_submodule(site.norm if isinstance(site, NormSite) else site.proj)
            hooks.append(head.register_forward_pre_hook(
                lambda m, a, key=(i, site.name): seen.__setitem__(key, a[0][0, -rows:].detach().clone())))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    entries = shipped()
    for i in at:
        for site in family.sites:
            x = seen[(i, site.name)]  # [rows, D]: what the model feeds the site
            for label, part, _ in site_parts(site.name, site_module(layers[i], site),
                                             PatchOptions().stacked_projections):
                ex = extract(part, (x,), f"{label}_m{rows}")
                entry = entries.get((digest(ex.graph), f"b{rows}"))
                if entry is None:
                    print(f"L{i} {label}: no shipped μGraph")
                    continue
                ug = from_text((entry / "ugraph.txt").read_text())
                by = dict(zip((v.name for v in ex.graph.inputs), ex.sources))
                feeds = [x if by[v.name][0] == "arg" else part.get_parameter(by[v.name][1]).detach() for v in ug.inputs]
                with torch.no_grad():
                    got, hf = triton_numerics(ug, feeds)[0], part(x)[0]
                    ref = copy.deepcopy(part).double()(x.double())[0]
                print(f"L{i} {label:10s} {entry.name:24s} ours vs float64 {rel(got, ref):.2e}   "
                      f"HF bf16 vs float64 {rel(hf, ref):.2e}   ours vs HF {rel(got, hf):.2e}")


def e2e(model, ids, steps: int) -> None:
    entries = shipped()

    def choose(program, *, budget, arch, cache=None, key=None, seed=None, pick=None, **_options):
        entry = entries.get((digest(program), key.bucket if key else "b1"))
        graph = from_text((entry / "ugraph.txt").read_text()) if entry else program
        # verified when the GPU's patch() hits the entry; here only its numerics are in question
        return optimize.Choice(graph, "cache", f"shipped {entry.name if entry else 'none: the program'}",
                               0.0, verification=optimize.Verification(True, "shipped", 0.0))

    def build_triton_numerics(graph, backend, device, launch=None, binaries=None, *, pdl=True):
        return backends.Executor(lambda *ts: triton_numerics(graph, list(ts)), "torch", False, 0, 0.0)

    eager = bench_sampling.sample(model, ids, steps, 0, True)
    reference = bench_sampling.reference(model, ids, eager[0])
    optimize.choose, backends.build = choose, build_triton_numerics  # this process only
    with tempfile.TemporaryDirectory() as scratch:  # a user cache of its own: nothing of this run is kept
        report = mirage_serve.patch(model, backend="torch", batch_sizes=(ids.shape[0],), cuda_graphs=False,
                                    decode_attention=False, cache_dir=scratch, options=PatchOptions(paired_launch=False))
    print(f"patched {sum(s.patched for s in report.sites)} sites; {sorted({s.source_note for s in report.sites})}")
    ours = bench_sampling.sample(model, ids, steps, 0, True)
    r = bench_sampling.compare(eager, ours, ours[0], 1e-2, reference)
    print(bench_sampling.summary({ids.shape[0]: r}))
    print("per step, eager vs float32:", " ".join(f"{rel(eager[1][:, s], reference[:, s]):.2e}" for s in range(steps)))
    print("per step, ours  vs float32:", " ".join(f"{rel(ours[1][:, s], reference[:, s]):.2e}"
                                                  for s in range(r["steps_compared"])))


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    a.add_argument("what", choices=("own", "sites", "e2e"))
    a.add_argument("model")
    a.add_argument("--vocab", type=int, default=8192)
    a.add_argument("--layers", type=int, default=None)
    a.add_argument("--prompt", type=int, default=32)
    a.add_argument("--rows", type=int, default=1, help="sites: rows (bucket) of the site programs")
    a.add_argument("--layers-at", default="1", help="sites: which layers, comma-separated")
    a.add_argument("--steps", type=int, default=8, help="e2e: sampled steps")
    a.add_argument("--batch", type=int, default=1, help="own / e2e: prompts (the decode bucket of e2e)")
    args = a.parse_args()
    model = build(args.model, args.vocab, args.layers)
    ids = torch.randint(3, args.vocab, (args.batch, args.prompt), generator=torch.Generator().manual_seed(1))
    if args.what == "own":
        own(model, ids)
    elif args.what == "sites":
        sites(model, ids, [int(i) for i in args.layers_at.split(",")], args.rows)
    else:
        e2e(model, ids, args.steps)


if __name__ == "__main__":
    main()
