"""`bench --tp N` / `warm --tp N` argument handling: the launch line, refusals in one line (no GPU, fast)."""
from __future__ import annotations

import pytest

from mirage_serve import cli_errors as E
from mirage_serve.cli import main
from mirage_serve.tp import launch as launch_mod
from mirage_serve.tp.safety import MULTICAST_OFF


@pytest.fixture
def rank_env(monkeypatch):
    """This process looks like rank 0 of 2 started by torchrun, multicast off."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for k, v in MULTICAST_OFF.items():
        monkeypatch.setenv(k, v)


def test_bench_tp_from_a_shell_starts_torchrun(monkeypatch, capsys):
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    started = []
    monkeypatch.setattr(launch_mod, "launch", lambda n, argv, env=None, timeout=None: started.append((n, argv)) or 7)
    assert main(["bench", "Llama-3.1-8B", "--tp", "2", "--batch", "1"]) == 7
    assert started == [(2, ["-m", "mirage_serve.cli", "bench", "Llama-3.1-8B", "--tp", "2", "--batch", "1"])]
    err = capsys.readouterr().err
    assert "NCCL_NVLS_ENABLE=0" in err and "--nproc-per-node=2 -m mirage_serve.cli bench Llama-3.1-8B --tp 2" in err


def test_heads_not_divisible_refused_in_one_line(rank_env, capsys):
    # SmolLM2-135M: 9 query heads, 3 kv heads
    assert main(["bench", "SmolLM2-135M", "--tp", "2", "--device", "cpu"]) == E.EXIT_USAGE
    err = capsys.readouterr().err.strip()
    assert err == ("mirage-serve: error: tensor-parallel world size 2 does not divide the query heads 9, "
                   "kv heads 3; choose a --tp that divides them")


def test_world_size_must_match_tp(rank_env, capsys):
    assert main(["bench", "Llama-3.1-8B", "--tp", "4", "--device", "cpu"]) == E.EXIT_USAGE
    assert "--tp 4 but torchrun started 2 processes" in capsys.readouterr().err


def test_rank_without_multicast_off_is_refused(rank_env, monkeypatch, capsys):
    monkeypatch.delenv("NCCL_NVLS_ENABLE")
    assert main(["bench", "Llama-3.1-8B", "--tp", "2", "--device", "cpu"]) == E.EXIT_USAGE
    assert "NCCL_NVLS_ENABLE" in capsys.readouterr().err


def test_warm_tp_refuses_a_world_size_that_does_not_divide(capsys):
    assert main(["warm", "Llama-3.1-8B", "--tp", "3"]) == E.EXIT_USAGE
    assert "does not divide the query heads 32, kv heads 8, intermediate size 14336" in capsys.readouterr().err
