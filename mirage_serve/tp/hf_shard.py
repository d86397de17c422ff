"""Shard a from_config Hugging Face model by its own tp_plan under torch.distributed, as from_pretrained does.

``from_pretrained(..., tp_plan="auto")`` (or ``distributed_config=DistributedConfig(tp_size=N)``)
loads a checkpoint straight into shards; benchmarks and tests build models from a config with
random weights instead, so they shard a full model in place with the same transformers function
(``transformers.distributed.tensor_parallel.apply_tensor_parallelism``): every rank builds the same
full weights (same seed), keeps its shard (``distribute_tensor(..., src_data_rank=None)`` slices
locally, no communication), and HF installs its TP forwards (all-reduce after the row-wise
projections). transformers 5.17 takes the plan from the model; 5.24 takes it as an argument.
"""
from __future__ import annotations

import inspect
import os
from datetime import timedelta

import torch
import torch.distributed as dist

from .. import knobs
from .safety import assert_multicast_off


def init_distributed(device_type: str, timeout_s: float = 300.0) -> tuple[int, int]:
    """Join the torchrun job (NCCL on CUDA, gloo on CPU); returns (rank, world size).
    On CUDA the process's GPU is ``LOCAL_RANK``."""
    assert_multicast_off()
    ranks = knobs.torchrun_ranks()
    if ranks is None:
        raise RuntimeError("not started by torchrun (RANK / WORLD_SIZE unset); see `mirage-serve bench --tp`")
    if device_type == "cuda":
        torch.cuda.set_device(ranks[2])
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        kw = {"device_id": torch.device("cuda", torch.cuda.current_device())} if device_type == "cuda" else {}
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s), **kw)
    return dist.get_rank(), dist.get_world_size()


def shard_in_place(model, device_type: str):
    """Shard ``model`` (full weights, identical on every rank) by its tp_plan over all ranks;
    returns the model (its Linear weights are now DTensor shards)."""
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.distributed import DistributedConfig
    from transformers.distributed.tensor_parallel import apply_tensor_parallelism

    world = dist.get_world_size()
    mesh = init_device_mesh(device_type, (world,))
    dcfg = DistributedConfig(tp_size=world, tp_plan="auto")
    model.config.distributed_config = dcfg
    model._device_mesh, model._tp_size = mesh, world
    if "tp_plan" in inspect.signature(apply_tensor_parallelism).parameters:  # transformers ≥ 5.2x
        tp_plan, _, _ = model._resolve_parallel_plans(dcfg)
        # A tied lm_head is no parameter of its own (named_parameters lists the embedding only):
        # HF's loop cannot find it; it stays replicated, as the embedding it shares must.
        apply_tensor_parallelism(model, mesh, _untied(model, tp_plan))
    else:  # 5.17: the plan is the model's own
        apply_tensor_parallelism(model, mesh)
    return model


def _untied(model, tp_plan: dict) -> dict:
    """``tp_plan`` without entries for a weight shared with another module (a tied lm_head): it is
    listed under the embedding only, HF's loop cannot shard it, and it must stay replicated."""
    params = {n for n, _ in model.named_parameters()}
    modules = dict(model.named_modules())

    def tied(name: str) -> bool:
        if name in params:
            return False
        module = modules.get(name)
        if module is None:  # a parameter name listed under another module: shared
            return True
        return any(f"{name}.{p}" not in params for p, _ in module.named_parameters(recurse=False))
    return {k: v for k, v in tp_plan.items() if not tied(k)}


def sharded_from_config(config, dtype, device_type: str, seed: int = 0):
    """A random-weight model built directly as this rank's shards: built on the meta device,
    sharded by its tp_plan, then each local shard drawn N(0, 0.02) on this rank's device. No rank
    ever holds the full weights (Llama-3.1-70B: 141 GB in bf16, 17.6 GB a GPU at TP=8). Replicated
    parameters are drawn from the same seed on every rank (identical), shards from a per-rank one."""
    import torch.nn as nn
    from torch.distributed.tensor import DTensor
    from transformers import AutoModelForCausalLM

    device = torch.device(device_type, torch.cuda.current_device()) if device_type == "cuda" else torch.device("cpu")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    shard_in_place(model, device_type)
    rank = dist.get_rank()
    shared = torch.Generator(device=device).manual_seed(seed)
    own = torch.Generator(device=device).manual_seed(seed + 1 + rank)
    made: dict[int, nn.Parameter] = {}  # id(meta parameter) -> its replacement (one per shared parameter)
    with torch.no_grad():
        for module in list(model.modules()):
            for name, p in list(module._parameters.items()):
                if p is None:
                    continue
                if id(p) in made:
                    module._parameters[name] = made[id(p)]
                    continue
                if isinstance(p, DTensor):
                    local = torch.empty(p.to_local().shape, dtype=p.dtype, device=device).normal_(0.0, 0.02, generator=own)
                    t = DTensor.from_local(local, p.device_mesh, p.placements, run_check=False,
                                           shape=p.shape, stride=p.stride())
                else:
                    t = torch.empty(p.shape, dtype=p.dtype, device=device).normal_(0.0, 0.02, generator=shared)
                module._parameters[name] = made[id(p)] = nn.Parameter(t, requires_grad=False)
        _materialise_buffers(model, device)
    return model.eval()


def _materialise_buffers(model, device) -> None:
    """Buffers computed at construction (RoPE's inverse frequencies) are meta after a meta build:
    rebuild their module from its config on the CPU and move it to ``device``."""
    for parent in list(model.modules()):
        for child_name, child in list(parent._modules.items()):
            if child is None or not any(b is not None and b.is_meta for b in child._buffers.values()):
                continue
            if any(p.is_meta for p in child.parameters(recurse=False)) or not hasattr(child, "config"):
                raise RuntimeError(f"cannot materialise the buffers of {type(child).__qualname__} "
                                   f"built on the meta device")
            with torch.device("cpu"):
                fresh = type(child)(child.config)
            parent._modules[child_name] = fresh.to(device)
    left = [n for n, b in model.named_buffers() if b.is_meta]
    if left:
        raise RuntimeError(f"buffers left on the meta device: {left[:3]}")
