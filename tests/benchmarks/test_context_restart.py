"""benchmarks/context_restart.py: a table benchmark goes on past a launch that breaks its CUDA context."""
from __future__ import annotations

import sys

import pytest

from benchmarks import context_restart as cr
from superopt.codegen.launch import Launch


def test_refused_launches_round_trip_through_the_file(tmp_path):
    path = str(tmp_path / "blocks.md.refused.json")
    assert cr.load_refused(path) == [] and cr.load_refused("") == []
    cr.save_refused(path, ("graph a\n", Launch(4, 3, prefetch=True)))
    cr.save_refused(path, ("graph b\n", None))
    assert cr.load_refused(path) == [("graph a\n", Launch(4, 3, prefetch=True)), ("graph b\n", None)]


def test_finished_rows_are_results_and_failures_not_rows_left_unrun():
    lines = ["device: x", "", "| row | dtype | searched (graph) | hand-written |", "|---|---|---|---|",
             "| GQA b1 | bfloat16 | 9.4 | 19.1 |",
             "| GQA b8 | bfloat16 | FAILED: RuntimeError: x |",
             "| QKNorm b8 | bfloat16 | not run: past the 520 s deadline |"]
    assert cr.finished_rows(lines) == {("GQA b1", "bfloat16"), ("GQA b8", "bfloat16")}


def test_restart_runs_the_same_command_resumed_with_the_time_left(monkeypatch):
    from benchmarks import bench_blocks
    calls = []
    monkeypatch.setattr(cr.os, "execv", lambda exe, argv: calls.append((exe, argv)))
    argv = ["benchmarks/bench_blocks.py", "--suite", "paper", "--deadline-s", "520", "--only", "GQA b8",
            "--compile-budget-s=520", "--out", "o/blocks.md", "--resume", "--refused", "r.json", "--restarts", "1"]
    cr.restart(argv, "r.json", 1, 301.4)
    ((exe, new),) = calls
    assert exe == sys.executable and new[:2] == [sys.executable, "benchmarks/bench_blocks.py"]
    args = bench_blocks.parse_args(new[2:])
    assert (args.suite, args.only, args.out, args.resume, args.refused, args.restarts) == \
        ("paper", "GQA b8", "o/blocks.md", True, "r.json", 2)
    assert args.deadline_s == 301 and args.compile_budget_s == 301


@pytest.mark.parametrize("left", [-5.0, 0.4])
def test_a_restart_past_the_deadline_starts_no_row(monkeypatch, left):
    calls = []
    monkeypatch.setattr(cr.os, "execv", lambda exe, argv: calls.append(argv))
    cr.restart(["b.py"], "r.json", 0, left)
    assert calls[0][-4:] == ["--deadline-s", "0", "--compile-budget-s", "0"]
