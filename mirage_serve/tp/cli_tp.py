"""`mirage-serve bench MODEL --tp N` and `mirage-serve warm MODEL --tp N`.

bench: run from a shell, it prints the one torchrun line and starts it (``launch``); each of the N
ranks then runs the usual bench on its GPU with the model sharded by HF's tp_plan, so every
baseline (HF eager, HF static cache + compile) is HF's own tensor-parallel model and "ours" is
patch() on the shards. All ranks run the same generate() calls (their collectives must match);
rank 0 prints the table and writes the files, with the floor per GPU (weights ÷ N).

warm: searches and compiles one rank's kernels on a shard-shaped model (``shards.simulated``) in
one process: no torchrun and no second GPU needed; the sharded patch then finds them.
"""
from __future__ import annotations

import os
import sys

from .. import knobs
from ..cli_errors import EXIT_USAGE, CliError


def under_torchrun() -> bool:
    return knobs.torchrun_ranks() is not None


def launch_bench(args) -> int | None:
    """From a shell: start ``args.argv`` on ``args.tp`` ranks and return torchrun's status.
    Under torchrun: None (this process is a rank; the caller goes on), after checking the job."""
    from .launch import launch, torchrun_line
    from .safety import MulticastError, assert_multicast_off

    if under_torchrun():
        try:
            assert_multicast_off()
        except MulticastError as err:
            raise CliError(str(err), EXIT_USAGE) from None
        world = knobs.torchrun_ranks()[1]
        if world != args.tp:
            raise CliError(f"--tp {args.tp} but torchrun started {world} processes", EXIT_USAGE)
        return None
    argv = ["-m", "mirage_serve.cli", *args.argv]
    print(f"mirage-serve: starting {args.tp} ranks: {torchrun_line(args.tp, argv)}", file=sys.stderr, flush=True)
    return launch(args.tp, argv)


def load_sharded(opts, tp: int):
    """This rank's LoadedModel sharded by HF's tp_plan: a registry model drawn directly as shards
    (``sharded_from_config``), a checkpoint loaded whole, broadcast from rank 0 and sharded. A world
    size that does not divide the heads is refused before anything is loaded."""
    import torch
    import torch.distributed as dist

    from .. import registry
    from ..bench_load import LoadedModel, _facts, _override, load
    from .hf_shard import init_distributed, shard_in_place, sharded_from_config
    from .shards import divides

    device = "cuda" if opts.device.startswith("cuda") else "cpu"
    entry = _registry_entry(opts.model)
    if entry is not None:
        facts = _override(entry.config, opts.layers, opts.overrides)
        why = divides(registry.hf_config(facts), tp)
        if why:
            raise CliError(why, EXIT_USAGE)
    init_distributed(device)
    if entry is not None:  # random weights: drawn as shards, no rank holds the whole model
        model = sharded_from_config(registry.hf_config(facts), registry.torch_dtype(opts.dtype), device, opts.seed)
        return LoadedModel(model, entry.name, f"random weights (normal 0, 0.02), architecture of {entry.hub_id}, "
                           f"drawn as {tp} tensor-parallel shards", True, {**_facts(model.config),
                                                                            "tensor_parallel": tp})
    lm = load(opts.model, dtype=opts.dtype, device=device, layers=opts.layers, overrides=opts.overrides,
              seed=opts.seed)
    why = divides(lm.model.config, tp)
    if why:
        raise CliError(why, EXIT_USAGE)
    with torch.no_grad():
        for p in lm.model.parameters():  # identical weights on every rank, whatever the RNG did
            dist.broadcast(p.data, 0)
    shard_in_place(lm.model, device)
    lm.facts["tensor_parallel"] = tp
    return lm


def _registry_entry(spec):
    """The registry entry ``spec`` names (a model drawn with random weights), or None (a checkpoint)."""
    from .. import registry

    if not spec or "/" in spec or spec.startswith((".", "~")) or os.path.exists(os.path.expanduser(spec)):
        return None
    try:
        return registry.get(spec)
    except registry.UnknownModelError:
        return None


def finish(result: dict, args, lm=None) -> None:
    """Per-GPU floor and the TP facts in the record; ranks other than 0 print and write nothing."""
    import torch.distributed as dist

    tp = args.tp
    if result.get("floor_ms"):
        result["floor_ms"] /= tp
        for row in result.get("rows", []):
            if row.get("pct_of_floor"):
                row["pct_of_floor"] /= tp
    result["tensor_parallel"] = {"world": tp, "backend": dist.get_backend() if dist.is_initialized() else None,
                                 "floor": "bytes per GPU (weights ÷ world) ÷ copy bandwidth",
                                 "baselines": "HF's tensor-parallel model (tp_plan), same ranks"}
    result["notes"].append(f"tensor parallel over {tp} ranks: baselines are HF's TP model; the floor is per GPU")
    share = _allreduce_share(result, (lm.facts if lm is not None else {}).get("hidden_size"))
    if share:
        result["tensor_parallel"]["allreduce"] = share
        result["notes"].append("all-reduce per step (2 a layer, timed alone inside a CUDA graph): " + ", ".join(
            f"b{x['batch']} {x['count']} × {x['us']:.1f} µs = {x['ms_per_step']:.3f} ms"
            + (f" ({x['share_of_ours']:.0%} of ours)" if x.get("share_of_ours") else "") for x in share))
    if dist.is_initialized() and dist.get_rank() != 0:
        args.json = args.markdown = args.plot = None
        args.report = False
        sys.stdout = open(os.devnull, "w")


def _allreduce_share(result: dict, hidden: int | None) -> list[dict]:
    """Per batch: the decode step's all-reduces (2 a layer, ``batch × hidden`` activations) timed
    alone in a CUDA graph on these ranks, and their share of our ms/step. Collective; GPU only."""
    import torch

    if not torch.cuda.is_available() or result["settings"]["device"] != "cuda":
        return []
    from .collective import allreduce_times

    facts = result["model"]
    if not hidden:
        return []
    itemsize = {"bf16": 2, "fp16": 2, "fp32": 4}.get(result["settings"]["dtype"], 2)
    out = []
    for b in result["settings"]["batches"]:
        row = allreduce_times((b * hidden * itemsize,), graphed=True)[0]
        us = row.get("graph_us", row["eager_us"])
        count = 2 * int(facts["num_hidden_layers"])
        ours = next((r["ms_per_step"] for r in result.get("rows", []) if r["run"] == "ours" and r["batch"] == b), None)
        out.append({"batch": b, "bytes": row["bytes"], "us": us, "count": count, "ms_per_step": count * us / 1e3,
                    "share_of_ours": count * us / 1e3 / ours if ours else None, "graphed": "graph_us" in row})
    return out


def warm_tp(args, warm_model, progress, dtype: str):
    """``warm_model`` on the shard-shaped config of ``args.model`` at ``args.tp`` ranks, in ``dtype``."""
    from ..cache.warm import resolve_config
    from .shards import divides, shard_shaped_config, simulated

    name, config = resolve_config(args.model)
    why = divides(config, args.tp)
    if why:
        raise CliError(why, EXIT_USAGE)
    shard = shard_shaped_config(config, args.tp)
    with simulated(args.tp):
        return warm_model(shard, batch_sizes=args.batch, dtype=dtype, cache_dir=args.cache_dir,
                          progress=progress, backend=args.backend, num_layers=args.layers)
