"""patch()'s numeric self-check: every bucket of a design the first time the design is installed,
then one bucket per further layer (the weights bound), and a wrong weight binding still caught."""
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import mirage_serve
from mirage_serve.patching import prepare


def _model(layers: int):
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=61, hidden_size=24, intermediate_size=40, num_hidden_layers=layers,
                      num_attention_heads=3, num_key_value_heads=1, head_dim=8)
    return LlamaForCausalLM(cfg).eval()


def test_later_layers_check_one_bucket(monkeypatch):
    checked = []   # the buckets each site's self-check ran
    real = prepare.Preparer._unchecked_buckets
    monkeypatch.setattr(prepare.Preparer, "_unchecked_buckets",
                        lambda self, runtime: checked.append(real(self, runtime)) or checked[-1])
    report = mirage_serve.patch(_model(3), backend="torch", batch_sizes=(1, 3, 4))
    assert not report.unpatched, str(report)
    sites = sum(s.layer >= 0 for s in report.sites) // 3    # sites a layer
    # the first layer: every bucket of each site's design; layers 2 and 3: the smallest bucket alone;
    # the final norm, after them: a site whose kernels no layer site runs alone, so every bucket
    assert checked == [[1, 3, 4]] * sites + [[1]] * 2 * sites + [[1, 3, 4]]
    assert all(s.check_error <= 1e-5 for s in report.sites)   # fp32 on the torch backend


def test_a_layer_bound_to_other_weights_is_caught(monkeypatch):
    """The one bucket a later layer checks still sees its own weights: bind layer 0's weights into
    every layer's kernels and the check of layer 1 fails the site."""
    real = prepare.Preparer._prepare
    first = {}

    def layer0_kernels(self, wrapper, site, *args, **kwargs):
        runtime = real(self, wrapper, site, *args, **kwargs)
        first.setdefault(site.name, runtime)
        return first[site.name]   # every layer runs layer 0's kernels and weights

    monkeypatch.setattr(prepare.Preparer, "_prepare", layer0_kernels)
    report = mirage_serve.patch(_model(2), backend="torch", batch_sizes=(1, 2))
    failed = [s for s in report.sites if not s.patched and "self-check failed" in s.reason]
    assert failed, str(report)
