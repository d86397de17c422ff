"""A decode step's inputs passed as the loop's own buffers (mirage_serve.decode.step_inputs): only where HF's
preparation handed back nothing but those buffers and a copy of the ids, and the embedding rows only where the
embedding is a plain row gather."""
from __future__ import annotations

import torch

from mirage_serve.decode.step_inputs import direct_inputs, embedding_weight


class _Cache:  # stands in for HF's cache object: passed through as it is
    pass


def _prepared():
    ids = torch.randint(0, 50, (3, 1))
    pos, mask, cache = torch.arange(3).view(3, 1), torch.ones(3, 1, 1, 8, dtype=torch.bool), _Cache()
    prepared = {"input_ids": ids.clone(), "cache": cache, "position_ids": pos, "attention_mask": mask,
                "use_cache": True, "logits_to_keep": 1}
    return prepared, ids, [pos, mask]


def test_the_loops_own_buffers_pass_as_they_are_with_the_ids_buffer_for_the_copy():
    prepared, ids, passed = _prepared()
    out = direct_inputs(prepared, ids, passed)
    assert out["input_ids"] is ids and out["position_ids"] is passed[0] and out["attention_mask"] is passed[1]
    assert out["cache"] is prepared["cache"] and out["use_cache"] is True and out["logits_to_keep"] == 1
    embeds = torch.randn(3, 1, 16)
    out = direct_inputs(prepared, ids, passed, embeds)
    assert out["input_ids"] is None and out["inputs_embeds"] is embeds


def test_anything_preparation_made_itself_keeps_it_every_step():
    prepared, ids, passed = _prepared()
    assert direct_inputs(dict(prepared, position_ids=passed[0].clone()), ids, passed) is None  # equal, not ours
    assert direct_inputs(dict(prepared, attention_mask={"full": passed[1]}), ids, passed) is None  # a mask dict
    assert direct_inputs(dict(prepared, token_type_ids=torch.zeros(3, 1)), ids, passed) is None
    assert direct_inputs(dict(prepared, input_ids=ids + 1), ids, passed) is None  # not the ids
    assert direct_inputs(dict(prepared, input_ids=ids.float()), ids, passed) is None
    assert direct_inputs(dict(prepared, input_ids=ids.repeat(1, 2)), ids, passed) is None
    no_ids = dict(prepared)
    del no_ids["input_ids"]
    assert direct_inputs(no_ids, ids, passed) is None
    assert direct_inputs(dict(prepared, inputs_embeds=torch.zeros(3, 1, 4)), ids, passed) is None


def test_embedding_rows_only_where_the_embedding_is_a_plain_gather():
    class Scaled(torch.nn.Embedding):  # as Gemma-3's: its forward multiplies the rows
        def forward(self, x):
            return super().forward(x) * 2.0

    class Model(torch.nn.Module):
        def __init__(self, emb):
            super().__init__()
            self.emb = emb

        def get_input_embeddings(self):
            return self.emb

    plain = torch.nn.Embedding(11, 4)
    assert embedding_weight(Model(plain)) is plain.weight
    assert embedding_weight(Model(Scaled(11, 4))) is None
    assert embedding_weight(Model(torch.nn.Embedding(11, 4, max_norm=1.0))) is None
    assert embedding_weight(torch.nn.Linear(2, 2)) is None  # no get_input_embeddings

    class Sub(torch.Tensor):  # as a tensor-parallel shard's DTensor: no storage of its own to hand a kernel
        pass

    sharded = torch.nn.Embedding(11, 4)
    sharded.weight = torch.nn.Parameter(torch.randn(11, 4).as_subclass(Sub))
    assert embedding_weight(Model(sharded)) is None
