"""Shared set-up for the CLI tests: a tiny odd-shaped Llama (random weights) that benches in seconds."""
from __future__ import annotations

# SmolLM2-135M's family cut down: hidden 72 = 4 heads × 18, GQA 4/2, odd intermediate and vocab.
TINY_SET = ["hidden_size=72", "intermediate_size=100", "vocab_size=311", "num_attention_heads=4",
            "num_key_value_heads=2", "head_dim=18"]
TINY_FACTS = {"model_type": "llama", "hidden_size": 72, "intermediate_size": 100, "vocab_size": 311,
              "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 18, "num_hidden_layers": 2,
              "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": False,
              "max_position_embeddings": 256, "bos_token_id": 0, "eos_token_id": 0}


def tiny_bench_args(*extra: str) -> list[str]:
    """argv for `bench` on the tiny model: 2 layers, batches 1 and 3, prompt 9, 6 new tokens, CPU."""
    args = ["bench", "SmolLM2-135M", "--layers", "2", "--batch", "1,3", "--prompt-len", "9",
            "--new-tokens", "6", "--device", "cpu"]
    for kv in TINY_SET:
        args += ["--set", kv]
    return args + list(extra)
