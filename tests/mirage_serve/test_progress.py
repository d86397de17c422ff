"""Progress lines for the slow parts of patch() and a first decode step: a search announces itself, a signed
cache hit does not, and MIRAGE_SERVE_PROGRESS=0 silences them."""
from __future__ import annotations

import pytest

from mirage_serve import optimize, progress
from mirage_serve.cache import CacheKey, KernelCache, versions_now
from superopt.ir import digest
from tests.fixtures.budget import states_budget

from ..fixtures.programs import down_proj


def test_slow_writes_one_line_finished_with_its_seconds(capsys):
    with progress.slow("searching x"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("mirage_serve: searching x ... done in ") and err[0].endswith(" s")


def test_a_nested_step_gets_lines_of_its_own(capsys):
    with progress.slow("choosing a"), progress.slow("searching b"):
        pass
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "mirage_serve: choosing a ..." and err[1].startswith("mirage_serve: searching b ... done in ")
    assert err[2].startswith("mirage_serve: choosing a: done in ") and len(err) == 3


def test_slow_says_when_an_error_stopped_it(capsys):
    with pytest.raises(RuntimeError), progress.slow("searching y"):
        raise RuntimeError("boom")
    assert "mirage_serve: searching y ... stopped by an error in " in capsys.readouterr().err


def test_a_search_announces_itself_and_a_signed_hit_is_silent(tmp_path, capsys):
    program = down_proj()
    cache = KernelCache(tmp_path)
    key = CacheKey(digest(program), "b2", "bf16", "sm90", "triton", versions_now(), "mlp_out-m2")
    assert optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key).source == "search"
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("mirage_serve: mlp_out-m2: searching its μGraph ... done in "), err
    assert optimize.choose(program, budget=states_budget(), arch="sm_90", cache=cache, key=key).source == "cache"
    assert capsys.readouterr().err == ""  # this user's own entry: believed, nothing slow


def test_progress_off_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv("MIRAGE_SERVE_PROGRESS", "0")
    assert optimize.choose(down_proj(), budget=states_budget(), arch="sm_90").source == "search"
    assert capsys.readouterr().err == ""
