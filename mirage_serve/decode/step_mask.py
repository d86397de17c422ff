"""The decode step's 4D attention mask kept on the device, one column a step, instead of built by HF every step.

HF builds a decode step's mask from the 2D mask (in ``prepare_inputs_for_generation`` for a static cache): about
a dozen small kernels a token (aranges, comparisons, an index, two ANDs) inside the captured step, where a 0.5–1B
model's kernels take a few µs each (docs/architecture.md, "From a decode step to the GPU"). For a static cache and
full attention that mask is, element for element,

    mask[b, 0, 0, j] = prompt_mask[b, j] (ones after the prompt)  and  j <= slot

with ``slot`` the cache slot of the token being decoded. ``StepMask`` holds it as a bool [B, 1, 1, L] tensor: the
prompt's columns are set per call (``start``), and each chosen token sets the column of the step that will read it
(``advance``). A 4D mask passed to HF is taken as it is (its mask builders return a 4D mask unchanged), so the
dozen kernels go.

Exactness is checked, not assumed: on a loop's first step HF still builds its own mask, and ``adopt`` takes ours
only when HF's is a single bool tensor of this shape equal to ours in every element; otherwise (sliding layers,
an additive float mask, another attention implementation's convention) the loop keeps passing the 2D mask.
"""
from __future__ import annotations

import torch


class StepMask:
    def __init__(self, batch: int, cache_len: int, dev: torch.device):
        self.mask = torch.zeros(batch, 1, 1, cache_len, dtype=torch.bool, device=dev)
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)  # the next step's cache slot
        self.adopted: bool | None = None  # None until the first step compared HF's mask with ours

    def start(self, prompt_mask: torch.Tensor | None, width: int) -> None:
        """The prompt's columns (all valid without a mask); the first decode step writes slot ``width``."""
        self.mask.zero_()
        if prompt_mask is None:
            self.mask[..., :width] = True
        else:
            self.mask[:, 0, 0, :width].copy_(prompt_mask.to(torch.bool))
        self.slot.fill_(width)

    def advance(self) -> torch.Tensor:
        """The next step's column set (HF's causality) and the slot moved past it. Called once a token is chosen
        (``fast_loop.DecodeLoop._advance``; the greedy kernels do the same in their last launch), so the mask is
        ready before the step that reads it. The token chosen after the cache's last slot has no step to run: the
        column written then is the last one again, which is already set."""
        self.mask.index_fill_(3, self.slot.clamp(max=self.mask.shape[-1] - 1), True)
        self.slot.add_(1)
        return self.mask

    def adopt(self, hf_mask) -> bool:
        """Whether HF's mask for this step (a tensor, or a {layer type: tensor} dict) is ours exactly; once."""
        if self.adopted is None:
            if isinstance(hf_mask, dict) and len(hf_mask) == 1:
                hf_mask = next(iter(hf_mask.values()))
            self.adopted = (isinstance(hf_mask, torch.Tensor) and hf_mask.dtype == torch.bool
                            and hf_mask.shape == self.mask.shape and bool(torch.equal(hf_mask, self.mask)))
        return self.adopted
