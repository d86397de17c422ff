"""patch(): the pipeline of named stages that swaps a decoder's blocks for searched kernels.

``pipeline`` runs them in order, each timed into ``PatchReport.stages`` (docs/architecture.md):

* sites: the family's adapter in ``patches/`` (module names as hints), or ``partition`` of the traced
  decoder layer (``trace``) for a family with none; the site kinds are ``sites``;
* residual plan: which residual adds move into which projection kernels (``residual``, with the
  rewritten layer forward of ``forward_rewrite`` and the hand-off of ``handoff``);
* prepare: per site, extract → choose (cache or search) → verify → build → self-check (``prepare``;
  k/v as one launch where faster, ``pairing``);
* install: every prepared site at once, undone as one (``install``); then decode attention and the
  CUDA-graph decode runner (``mirage_serve.decode``).

``programs`` gives the site programs of a registry model without patching one (tools, benchmarks).
"""
