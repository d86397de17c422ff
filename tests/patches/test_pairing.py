"""pairing.merge_twins: a site's two parts of one program become one part where a paired
launch was chosen at some bucket, its outputs in the parts' order; parts stay apart otherwise."""
from __future__ import annotations

import torch

from mirage_serve.backends import Executor
from mirage_serve.patching.pairing import merge_twins
from mirage_serve.patching.prepare import BucketKernel, bound_call


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


class _FakePaired:
    """Stands in for superopt.runtime.paired.PairedGraph: records what it was built from."""

    built: list = []

    def __init__(self, a, b, binaries=None):
        self.binaries_in, self.compiles = binaries, 0 if binaries else 1
        self.module = type("M", (), {"source": "# paired source\n"})()
        _FakePaired.built.append(self)

    def binaries(self):
        return {"k.cubin": b"\x7fcubin", "triton-kernels.json": b"{}"}

    def bind(self, fa, fb):
        return lambda x2: [x2, x2]


def _gpu_pair(monkeypatch, timed: list, paired_us: float, two_us: float):
    """Two BucketKernels whose executors pass for CompiledGraphs of one μGraph on a 'GPU': the
    paired build, its check and its timing replaced by stand-ins (``timed`` records each timing)."""
    import contextlib

    from mirage_serve import backends
    from mirage_serve.patching import pairing
    from superopt.runtime import build, paired
    from superopt.runtime.compiled import CompiledGraph
    from tests.fixtures.ugraphs import FIXTURES

    monkeypatch.setattr(paired, "PairedGraph", _FakePaired)
    monkeypatch.setattr(build, "interpreting", lambda: False)
    monkeypatch.setattr(pairing, "_agrees", lambda p, a, b: True)
    monkeypatch.setattr(pairing, "_time", lambda p, a, b, d: timed.append(1) or (paired_us, two_us))
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "stand-in GPU")
    monkeypatch.setattr(backends, "arch_of", lambda d: "sm_90")
    g = FIXTURES["rmsnorm_matmul"]().ugraph

    def kernel():
        cg = CompiledGraph.__new__(CompiledGraph)  # the attributes Pairing reads, nothing built
        cg.graph, cg.launch = g, {"k0": (4, 3)}
        return BucketKernel(Executor(cg, "triton", False, 0, 0.0), (None,), 1)
    return kernel(), kernel()


def test_pairing_decisions_and_kernels_come_back_from_the_kernel_cache(monkeypatch, tmp_path):
    from mirage_serve.cache import KernelCache
    from mirage_serve.patching.pairing import Pairing

    cache, timed, gpu = KernelCache(tmp_path, shipped_dir=False), [], torch.device("cuda")
    _FakePaired.built = []
    a, b = _gpu_pair(monkeypatch, timed, 7.8, 9.4)
    first = Pairing(gpu, cache, "bf16")
    assert first.call(a, b, 1) is not None and timed == [1]
    assert first.note(a, b) == "one paired launch: paired 7.8 µs, two launches 9.4 µs"
    assert _FakePaired.built[-1].binaries_in is None and first.compiles == 1
    # a later patch(): the decision and the paired kernels' binaries come from the cache, nothing is timed
    a2, b2 = _gpu_pair(monkeypatch, timed, 1.0, 1.0)
    again = Pairing(gpu, cache, "bf16")
    assert again.call(a2, b2, 1) is not None and timed == [1]
    assert again.note(a2, b2) == "one paired launch (cached: paired 7.8 µs, two launches 9.4 µs)"
    assert _FakePaired.built[-1].binaries_in == {"k.cubin": b"\x7fcubin", "triton-kernels.json": b"{}"}
    assert again.compiles == 0
    # another bucket is another decision; two launches when the pairing was not faster, remembered too
    assert Pairing(gpu, cache, "bf16").call(a2, b2, 8) is None and timed == [1, 1]
    built = len(_FakePaired.built)
    third = Pairing(gpu, cache, "bf16")
    assert third.call(a2, b2, 8) is None and timed == [1, 1] and len(_FakePaired.built) == built  # not even built
    assert third.note(a2, b2) == "two launches (cached: paired 1.0 µs, two launches 1.0 µs)"
