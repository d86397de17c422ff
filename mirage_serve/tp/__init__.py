"""Tensor-parallel decode: patch() on models sharded by Hugging Face's tp_plan (docs/tensor-parallel.md).

``shards``: per-shard views and the all-reduce after row-wise kernels (used by patch());
``hf_shard``: join a torchrun job and shard a from_config model as from_pretrained(tp_plan=…) does;
``launch``: start ranks under torchrun; ``safety``: NVLink multicast stays off in every process.
Nothing here is imported unless a model is sharded or ``--tp`` is asked for.
"""
