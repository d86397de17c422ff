"""PatchReport's text: the line that says which forward calls run the original modules."""
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
