"""decode.step_mask: the decode step's 4D mask kept one column a step, taken only where it is HF's exactly."""
from __future__ import annotations

import torch

from mirage_serve.decode.step_mask import StepMask


def _hf_style(prompt_mask: torch.Tensor, cache_len: int, slot: int) -> torch.Tensor:
    """HF's static-cache decode mask: the prompt's mask padded with ones, AND kv <= the step's slot."""
    b, w = prompt_mask.shape
    padded = torch.ones(b, cache_len, dtype=torch.bool)
    padded[:, :w] = prompt_mask.bool()
    return (padded & (torch.arange(cache_len) <= slot))[:, None, None, :]


def test_each_step_adds_its_slot_and_equals_hf_mask_at_every_step():
    prompt = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1], [0, 1, 1, 1, 1]])
    sm = StepMask(3, 11, torch.device("cpu"))
    for _ in range(2):  # a second call starts over
        sm.start(prompt, 5)
        for step in range(6):
            assert torch.equal(sm.advance(), _hf_style(prompt, 11, 5 + step))
    sm.start(None, 4)  # no prompt mask: every prompt column valid
    assert torch.equal(sm.advance(), _hf_style(torch.ones(3, 4), 11, 4))


def test_adopted_only_for_one_equal_bool_tensor_and_decided_once():
    prompt = torch.tensor([[0, 1, 1]])
    mine = StepMask(1, 6, torch.device("cpu"))
    mine.start(prompt, 3)
    hf = _hf_style(prompt, 6, 3)
    assert mine.advance() is mine.mask
    for other in (None, hf.float(), hf[..., :5], ~hf, {"full_attention": hf, "sliding_attention": hf},
                  torch.zeros(1, 6, dtype=torch.long)):
        sm = StepMask(1, 6, torch.device("cpu"))
        sm.start(prompt, 3)
        sm.advance()
        assert sm.adopt(other) is False and sm.adopt(hf) is False  # the first answer stands
    assert mine.adopt({"full_attention": hf}) is True


def test_a_token_chosen_after_the_last_slot_leaves_the_mask_as_it_was():
    prompt = torch.tensor([[0, 1, 1]])
    sm = StepMask(1, 5, torch.device("cpu"))
    sm.start(prompt, 3)
    sm.advance(), sm.advance()  # slots 3 and 4: the cache is full
    full = _hf_style(prompt, 5, 4)
    assert torch.equal(sm.mask, full)
    assert torch.equal(sm.advance(), full) and int(sm.slot) == 6  # no step reads it: nothing out of bounds
