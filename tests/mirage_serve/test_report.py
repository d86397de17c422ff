"""PatchReport's text: the line that says which forward calls run the original modules, the stage times."""
from __future__ import annotations

from mirage_serve.report import PatchReport


def test_calls_above_the_largest_bucket_are_reported_as_original():
    report = PatchReport("llama", "torch", "cpu", "float32", (1, 2, 16))
    line = ("not patched: forward calls with more than 16 rows (batch × tokens: prefill, or a decode batch "
            "above the largest bucket) run the original modules")
    assert report.rows_note() == line and line in str(report).splitlines()
    assert "more than 1 row (" in PatchReport("llama", "torch", "cpu", "float32", (1,)).rows_note()


def test_an_unsupported_model_reports_only_why():
    report = PatchReport("gpt2", "torch", "cpu", "float32", (1, 8), supported=False,
                         note="model type 'gpt2' is not supported: …; the model was left unchanged")
    assert str(report).splitlines()[1:] == [report.note]  # nothing was patched, so no rows line


def test_patch_times_each_stage_in_order_into_the_report():
    from transformers import LlamaConfig

    import mirage_serve
    from tests.patches.parity import build

    model = build(LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=8))
    report = mirage_serve.patch(model, backend="torch", search_budget=0, batch_sizes=(2,))
    assert list(report.stages) == ["sites", "residual plan", "prepare", "install"]  # CPU: no attention, no graphs
    assert all(t >= 0 for t in report.stages.values()) and sum(report.stages.values()) <= report.seconds
    assert "(sites " in report.counts() and "prepare " in report.counts()
    mirage_serve.unpatch(model)
    unsupported = PatchReport("gpt2", "torch", "cpu", "float32", (1,))
    assert unsupported.counts().endswith("0.0 s")  # no stage ran: no breakdown


def test_sites_whose_kernels_sum_across_blocks_say_whether_their_bits_can_vary():
    from mirage_serve.report import SiteReport

    report = PatchReport("llama", "triton", "cuda:0", "bfloat16", (1, 8))
    report.sites = [SiteReport(0, "mlp_out", ("mlp.down_proj",), patched=True, block_sums=1),
                    SiteReport(1, "mlp_out", ("mlp.down_proj",), patched=True, block_sums=1),
                    SiteReport(0, "attn_in", ("self_attn.q_proj",), patched=True),
                    SiteReport(0, "attn_out", ("self_attn.o_proj",), patched=False, block_sums=1)]
    line = report.block_sums_note()
    assert line.startswith("cross-block sums: 2 sites (mlp_out) add their blocks' partial sums with float atomics")
    assert "MIRAGE_SERVE_DETERMINISTIC=0" in line and line in str(report).splitlines()
    report.deterministic = True
    assert "in a fixed order (PatchOptions.deterministic)" in report.block_sums_note()
    report.sites = report.sites[2:]   # no patched site sums across blocks: nothing to say
    assert report.block_sums_note() == "" and "cross-block" not in str(report)
