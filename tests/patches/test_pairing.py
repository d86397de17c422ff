"""patch_pairing.merge_twins: a site's two parts of one program become one part where a paired
launch was chosen at some bucket, its outputs in the parts' order; parts stay apart otherwise."""
from __future__ import annotations

import torch

from mirage_serve.backends import Executor
from mirage_serve.patch_pairing import merge_twins
from mirage_serve.patch_prepare import BucketKernel, bound_call


def _kernel(scale: float, rows: int, log: list) -> BucketKernel:
    def run(x, w):
        log.append(scale)
        return [x * w]
    return BucketKernel(Executor(run, "stand-in", False, 0, 0.0), (None, torch.tensor(scale)), rows)


def _parts(log):
    return [("proj", {1: _kernel(2.0, 1, log), 8: _kernel(2.0, 8, log)}, (1,)),
            ("other", {1: _kernel(5.0, 1, log), 8: _kernel(5.0, 8, log)}, (2,)),
            ("proj", {1: _kernel(3.0, 1, log), 8: _kernel(3.0, 8, log)}, (3,))]


def test_twins_merge_at_the_first_place_paired_where_chosen_one_by_one_elsewhere():
    log, asked = [], []

    def pair_call(a, b, m):
        asked.append(m)
        if m != 8:
            return None
        return lambda x2: [x2 * 100, x2 * 200]  # a stand-in for one paired launch
    merged = merge_twins(_parts(log), pair_call)
    assert [outs for _, outs in merged] == [(1, 3), (2,)]
    assert sorted(asked) == [1, 8]
    x = torch.ones(2, 4)
    both = merged[0][0]
    assert [o[0, 0].item() for o in bound_call(both[8])(x)] == [100.0, 200.0]  # the paired call
    assert [o[0, 0].item() for o in bound_call(both[1])(x)] == [2.0, 3.0] and log == [2.0, 3.0]  # one by one


def test_twins_stay_apart_when_no_bucket_is_paired():
    log = []
    parts = _parts(log)
    merged = merge_twins(parts, lambda a, b, m: None)
    assert [outs for _, outs in merged] == [(1,), (2,), (3,)]
    assert all(k is p[1] for (k, _), p in zip(merged, parts))
