"""The decode loop of greedy/sampling generate() as one CUDA-graph replay per token.

One ``DecodeLoop`` per signature (batch size, static cache, token-choice settings) owns static
device buffers; a decode step reads and writes only them, so after the first step of the first call
the host does nothing per token but ``graph.replay()``:

    ids [B, 1] ── model forward (4D mask built from the full-length 2D mask) ── logits [B, V]
      └─ token choice (token_choice.TokenChooser) ── pad finished rows ── tokens[:, t] = tok
         ids = tok; pos += 1; t += 1; unfinished &= tok ∉ eos; generated += any(unfinished before)

Why a full-length 2D mask is exact: for a static cache HF builds the decode mask from the 2D mask
padded with zeros to the cache length, AND-ed with causality (kv ≤ the query's cache position). Our
mask holds the prompt's mask followed by ones for every later column; the columns it differs on
(beyond the current position) are removed by causality, so the 4D mask is the same, element for
element, and it is built inside the captured step from device state (the cache length is a tensor).
Where HF's 4D mask of the first step equals the one ``step_mask.StepMask`` keeps (one column a step),
later steps pass that instead, and HF builds none.

Finished rows: HF stops when every row has produced an EOS. Reading that needs a host sync, so the
loop polls a non-blocking copy every ``check_every`` steps and may run a few steps past the stop;
those steps only write pad tokens, and ``generated`` (HF's output length) stops counting at the
stop, so the returned tokens are HF's. Like ``GraphedStep``, ``capture=False`` runs the same step
eagerly through the same buffers (CPU tests).
"""
from __future__ import annotations

import logging

import torch

from superopt.runtime.interpreter import interpreting

from ..hf_names import CACHE_KWARG
from . import attention_fast, graph_step, step_inputs, window_layers
from .greedy_kernels import GreedyAdvance
from .rotary_table import RotaryTables
from .step_mask import StepMask
from .token_choice import TokenChooser

log = logging.getLogger("mirage_serve")


class DecodeLoop:
    def __init__(self, model, forward, cache, batch: int, cache_len: int, chooser: TokenChooser,
                 extra_inputs: dict, pool=None, capture: bool = False):
        self.model, self.forward, self.cache = model, forward, cache
        self.chooser, self.extra = chooser, dict(extra_inputs)  # e.g. use_cache, logits_to_keep
        self.capture, self.pool = capture, pool
        dev = model.device
        vocab = model.config.get_text_config().vocab_size
        with torch.inference_mode(False):  # normal tensors: updatable in and outside inference mode
            self._alloc(batch, cache_len, vocab, dev)
        # greedy without warpers on a GPU (or Triton's interpreter): the choice and bookkeeping in
        # two launches instead of ~12 (greedy_kernels); the torch ops otherwise
        on_triton = dev.type == "cuda" or interpreting()
        self.greedy = GreedyAdvance(batch, vocab, dev) if chooser.plain_greedy and on_triton else None
        # the steps' inputs as the loop's own buffers once checked (step_inputs): HF's preparation copies the ids
        # every step; with the greedy kernels, they also write the next step's embedding rows (a plain gather)
        self.embed_weight = step_inputs.embedding_weight(model) if self.greedy is not None else None
        self.embeds = None
        if self.embed_weight is not None:
            with torch.inference_mode(False):
                self.embeds = self.embed_weight.new_zeros(batch, 1, self.embed_weight.shape[1])
        self._direct: dict | None = None  # the inputs every step passes, where step_inputs.direct_inputs allows
        self._direct_checked = False
        self.rotary_rows = None  # (table, rows) the greedy kernels write at the new positions (RotaryTables.fold_into)
        self.rotary = RotaryTables(model, cache_len)  # cos/sin as one gather a step (rotary_table)
        self.graph = None
        self.sliding = window_layers.sliding_layers(cache)  # steps past a full window run eagerly
        self.captures = 0
        self.replays = 0
        self.capture_error: str | None = None  # set if capture failed and the loop runs eagerly

    def _alloc(self, batch: int, cache_len: int, vocab: int, dev: torch.device) -> None:
        long = torch.long
        self.ids = torch.zeros(batch, 1, dtype=long, device=dev)
        self.pos = torch.zeros(batch, 1, dtype=long, device=dev)
        self.mask = torch.ones(batch, cache_len, dtype=long, device=dev)
        self.tokens = torch.zeros(batch, cache_len, dtype=long, device=dev)  # ≥ any step count
        self.t = torch.zeros((), dtype=long, device=dev)          # tokens generated so far
        self.generated = torch.zeros((), dtype=long, device=dev)  # HF's output length
        self.min_new = torch.zeros((), dtype=long, device=dev)    # EOS suppressed while t < this
        self.unfinished = torch.ones(batch, dtype=torch.bool, device=dev)
        self.eos_mask = torch.zeros(vocab, dtype=torch.bool, device=dev)
        self.pad = torch.zeros((), dtype=long, device=dev)
        self.step_mask = StepMask(batch, cache_len, dev)  # HF's 4D mask, one column a step (step_mask)
        pinned = dev.type == "cuda"
        self._alive_host = torch.zeros((), dtype=torch.bool, pin_memory=pinned)
        self._alive_event = torch.cuda.Event() if pinned else None

    # ------------------------------------------------------------ per call
    def start(self, prompt_mask: torch.Tensor | None, width: int, next_pos: torch.Tensor,
              eos_ids: torch.Tensor | None, pad: torch.Tensor | None, min_new: int,
              first_logits: torch.Tensor) -> None:
        """Reset the per-call state after HF's prefill and take the first token from its logits."""
        self.mask.fill_(1)
        if prompt_mask is not None:
            self.mask[:, :width].copy_(prompt_mask)
        self.step_mask.start(prompt_mask, width)
        # the prompt's last position: _advance moves it on to the first generated token's, with the mask's column
        self.pos.copy_(next_pos.expand_as(self.pos) - 1)
        self.eos_mask.zero_()
        if eos_ids is not None:
            self.eos_mask[eos_ids.to(self.eos_mask.device).reshape(-1)] = True
        if pad is None:  # HF pads finished rows only when it has EOS ids, and then pad is set
            self.pad.zero_()
        else:
            self.pad.copy_(pad.reshape(()))
        self.min_new.fill_(min_new)
        self.t.zero_()
        self.generated.zero_()
        self.unfinished.fill_(True)
        self._advance(first_logits)

    def run(self, n_new: int, check_every: int = 16) -> torch.Tensor:
        """Steps 2..n_new (the first token came from the prefill); returns the new tokens [B, n]."""
        pending = False
        for i in range(1, n_new):
            if i % check_every == 0:
                if pending:  # copied check_every steps ago: normally done, so this rarely waits
                    if self._alive_event is not None:
                        self._alive_event.synchronize()
                    if not bool(self._alive_host):
                        break
                self._alive_host.copy_(self.unfinished.any(), non_blocking=True)
                if self._alive_event is not None:
                    self._alive_event.record()
                pending = True
            self.step()
        n = int(self.generated)  # the one sync that has to wait for the last step
        return self.tokens[:, :n].clone()

    # ------------------------------------------------------------ one step
    def step(self) -> None:
        if self.sliding and not window_layers.replayable(self.sliding):
            self._step()  # a full sliding window rolls, which a graph cannot replay: HF's code runs it
        elif self.graph is not None:
            self.graph.replay()
            self.replays += 1
            window_layers.advance(self.sliding, 1)  # the host length of sliding layers (window_layers)
        elif not self.capture or not window_layers.replayable(self.sliding, 2):
            # (the step a capture records is the next one: it must not fill a window either, or a
            # later call would replay a full window's step; this call's remaining steps run eagerly)
            self._step()
        else:
            # First step of this signature: run it eagerly (it *is* the step), then capture.
            graph_step.run_on_side_stream(self._step)
            frozen = window_layers.frozen_mask_layers(self.cache, attention_fast.kernel_layers(self.model))
            if frozen:  # (that step ran every first-use check: the verdicts are in)
                self.capture = False
                self.capture_error = (f"sliding layers {frozen} keep HF's attention, whose mask a capture would "
                                      f"freeze (window_layers)")
                log.warning("mirage_serve: decode loop runs eagerly: %s", self.capture_error)
                return
            try:
                graph, _ = graph_step.capture_graph(self._step, self.pool)
            except Exception as e:  # capture records without running: the state is still exact
                self.capture, self.capture_error = False, f"{type(e).__name__}: {e}"
                window_layers.resync(self.sliding)
                log.warning("mirage_serve: decode loop capture failed (%s); running it eagerly",
                            self.capture_error)
                return
            self.graph = graph
            self.captures += 1
            window_layers.advance(self.sliding, -1)  # the capture counted a token it did not write

    def _step(self) -> None:
        own = self.step_mask.adopted  # None on the loop's first step, until HF's mask is compared with ours
        inputs = self._direct if self._direct is not None else self._prepare(own)
        if own is None:  # HF built its mask this step: is it ours?
            self.step_mask.adopt(inputs.get("attention_mask"))
        with self.rotary.active():
            out = self.forward(**inputs, return_dict=True)
        self._advance(out.logits[:, -1])
        if not self._direct_checked and self.step_mask.adopted is not None:  # after the first step: eager
            self._check_direct()

    def _prepare(self, own) -> dict:
        """HF's preparation of a step's inputs from the loop's buffers (the step mask once adopted)."""
        return self.model.prepare_inputs_for_generation(
            self.ids, next_sequence_length=1, attention_mask=self.step_mask.mask if own else self.mask,
            **{CACHE_KWARG: self.cache}, position_ids=self.pos, **self.extra)

    def _check_direct(self) -> None:
        """Once, after the first step (its greedy kernels wrote the embedding rows of ``ids``): the inputs of the
        later steps, made by HF's preparation once and passed as they are where they hold only the loop's
        buffers (``step_inputs.direct_inputs``), with the embedding rows where they are the embedding's own."""
        self._direct_checked = True
        own = self.step_mask.adopted
        passed = [self.pos, self.step_mask.mask if own else self.mask]
        passed += [v for v in self.extra.values() if isinstance(v, torch.Tensor)]
        embeds = None
        if self.embeds is not None:
            with torch.no_grad():
                want = torch.nn.functional.embedding(self.ids, self.embed_weight)
            embeds = self.embeds if torch.equal(want, self.embeds) else None
        self._direct = step_inputs.direct_inputs(self._prepare(own), self.ids, passed, embeds)
        if self._direct is not None and self.greedy is not None:  # the steps pass self.pos as the position ids
            with torch.inference_mode(False):  # a buffer every later call reads, in inference mode or not
                self.rotary_rows = self.rotary.fold_into(self.pos)

    def _advance(self, logits: torch.Tensor) -> None:
        """Token choice and HF's bookkeeping of ``_sample``, in place on the device buffers, then the next step's
        position and step-mask column (they do not depend on the token; the greedy kernels fold them in)."""
        if self.greedy is not None:
            self.greedy(logits, self)
            return
        # Few, fused-where-possible ops: each is a kernel launch inside the graph, every token.
        logits = logits.to(copy=True, dtype=torch.float32)  # HF chooses from float32 scores
        tok = self.chooser(logits, self.t, self.min_new, self.eos_mask)  # [B]
        self.generated.add_(self.unfinished.any())  # HF runs this step iff a row is unfinished
        tok = torch.where(self.unfinished, tok, self.pad)  # HF: tok * unf + pad * (1 - unf)
        self.tokens.index_copy_(1, self.t.view(1), tok[:, None])
        self.unfinished.logical_and_(~self.eos_mask[tok])
        self.ids.copy_(tok[:, None])
        self.t.add_(1)
        self.pos.add_(1)
        if self.step_mask.adopted is not False:  # a rejected step mask costs no launches
            self.step_mask.advance()
