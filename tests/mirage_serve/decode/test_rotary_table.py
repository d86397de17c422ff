"""RoPE's cos/sin from a table in the decode loop: bit for bit the module's own forward, only where tabled."""
from __future__ import annotations

import pytest
import torch
from transformers import Gemma3TextConfig, LlamaConfig, LlamaForCausalLM, Qwen3Config
from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

from mirage_serve.decode import install_decode_graphs, uninstall_decode_graphs
from mirage_serve.decode.rotary_table import RotaryTables, rotary_modules

_SHAPE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096)


def _rotaries():
    llama3 = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                  original_max_position_embeddings=1024)
    yarn = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=1024)
    return {"llama": (LlamaRotaryEmbedding(LlamaConfig(**_SHAPE)), ()),
            "llama3_scaled": (LlamaRotaryEmbedding(LlamaConfig(**_SHAPE, rope_parameters=llama3)), ()),
            "yarn": (LlamaRotaryEmbedding(LlamaConfig(**_SHAPE, rope_parameters=yarn)), ()),
            "qwen3_head_dim_96": (Qwen3RotaryEmbedding(Qwen3Config(**_SHAPE, head_dim=96)), ()),
            "gemma3_local": (Gemma3RotaryEmbedding(Gemma3TextConfig(**_SHAPE)), ("sliding_attention",)),
            "gemma3_global": (Gemma3RotaryEmbedding(Gemma3TextConfig(**_SHAPE)), ("full_attention",))}


@pytest.mark.parametrize("name", list(_rotaries()))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_a_tabled_call_is_the_modules_own_answer_bit_for_bit(name, dtype):
    module, extra = _rotaries()[name]
    tables = RotaryTables(module, capacity=777)
    assert tables.modules == [module]
    x = torch.randn(3, 1, 64, dtype=dtype)
    pos = torch.tensor([[0], [776], [345]])
    want = module(x, pos, *extra)
    with tables.active():
        got = module(x, pos, *extra)
        again = module(x, torch.tensor([[5], [6], [775]]), *extra)
    assert [t for t in tables.tables.values()] and all(t is not None for t in tables.tables.values())
    for w, g in zip(want, got):
        assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w)
    for w, g in zip(module(x, torch.tensor([[5], [6], [775]]), *extra), again):
        assert torch.equal(g, w)


def test_sequence_dependent_rope_is_never_tabled():
    dynamic = dict(rope_type="dynamic", rope_theta=10000.0, factor=2.0)
    module = LlamaRotaryEmbedding(LlamaConfig(**_SHAPE, rope_parameters=dynamic))
    assert rotary_modules(module) == []


def test_other_calls_run_the_module_and_the_forward_is_put_back():
    module, _ = _rotaries()["llama"]
    own = module.forward
    module.forward = own  # an instance attribute someone else set: it must survive
    tables = RotaryTables(module, capacity=64)
    x = torch.randn(2, 5, 64)
    prefill = torch.arange(5)[None].expand(2, 5)
    with tables.active():
        got = module(x, prefill)  # several tokens a row: the module's own forward, no table
        assert module.forward is not own
    assert not tables.tables
    assert all(torch.equal(g, w) for g, w in zip(got, module(x, prefill)))
    assert module.__dict__["forward"] is own
    del module.forward
    with tables.active():
        module(torch.randn(1, 1, 64), torch.tensor([[3]]))
    assert "forward" not in module.__dict__ and len(tables.tables) == 1


def test_calls_by_keyword_are_tabled_and_unknown_calls_reach_the_module():
    module, _ = _rotaries()["llama"]
    tables = RotaryTables(module, capacity=64)
    x, pos = torch.randn(2, 1, 64), torch.tensor([[7], [63]])
    with tables.active():
        by_name = module(x=x, position_ids=pos)
        with pytest.raises(TypeError):  # what the module itself says of a call it cannot take
            module(x, seq_len=5)
    assert len(tables.tables) == 1
    assert all(torch.equal(g, w) for g, w in zip(by_name, module(x, pos)))


def test_the_decode_loop_takes_cos_and_sin_from_its_table():
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=97, intermediate_size=88, num_hidden_layers=2, **_SHAPE)).eval()
    ids = torch.randint(1, 97, (2, 7))
    kw = dict(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=12, do_sample=False, pad_token_id=0)
    want = model.generate(**kw)
    runner = install_decode_graphs(model, capture=False)
    got = model.generate(**kw)
    (loop,) = runner.loops.values()
    assert torch.equal(got, want)
    assert loop.rotary.modules == [model.model.rotary_emb]
    assert list(loop.rotary.tables.values())[0].shape == (loop.mask.shape[1], 2, 16)
    uninstall_decode_graphs(model)


def test_folded_rows_answer_calls_at_their_position_buffer_only():
    """fold_into: with one table in use, a buffer of its rows at the loop's positions answers calls made with exactly
    that position buffer (whoever moves the positions writes the new rows: the greedy kernels); any other call
    gathers; with two tables (Gemma-3's local and global) nothing is folded."""
    module, _ = _rotaries()["llama"]
    tables = RotaryTables(module, capacity=100)
    x, pos = torch.randn(2, 1, 64), torch.tensor([[7], [99]])
    assert tables.fold_into(pos) is None  # no table yet
    with tables.active():
        module(x, pos)
        table, rows = tables.fold_into(pos)
        assert torch.equal(rows, table[pos])
        rows.fill_(3.0)  # as if a kernel had written them: answered as they are
        cos, sin = module(x, pos)
        assert (cos == 3.0).all() and (sin == 3.0).all()
        other = torch.tensor([[7], [99]])  # equal positions, another buffer: gathered from the table
        cos, sin = module(x, other)
        assert torch.equal(cos, table[other][..., 0, :]) and torch.equal(sin, table[other][..., 1, :])
    gemma, extra = _rotaries()["gemma3_local"]
    both = RotaryTables(gemma, capacity=100)
    with both.active():
        gemma(x, pos, "sliding_attention")
        gemma(x, pos, "full_attention")
    assert both.fold_into(pos) is None
