"""One persistent launch for a sequence of kernels (superopt.runtime.persistent, codegen.persistent), on a CPU."""
from __future__ import annotations

import re

import pytest

from superopt.runtime.persistent import _Hazards
from tests.interpreter import run_interpreted

TOL = {"float32": 1e-5, "float16": 2e-3}  # docs/conventions.md tolerance table


@pytest.mark.parametrize("dtype,programs,tasks_per_launch", [("float32", 1, 0), ("float16", 1, 0), ("float16", 3, 0),
                                                             ("float32", 2, 2), ("float16", 3, 4)])
def test_two_layers_in_one_launch_match_the_graphs_one_by_one(dtype, programs, tasks_per_launch):
    """``tasks_per_launch``: 0, a task a block; else each launch cut into at most that many tasks of several
    blocks (odd counts: a last task with fewer blocks)."""
    r = run_interpreted("-m", "tests.superopt.runtime.persistent_interp_run", dtype, str(programs),
                        *([str(tasks_per_launch)] if tasks_per_launch else []))
    assert r["recorded"], "recording() did not collect the calls (plain and bound) with their tensors, in order"
    assert r["equal"], "the persistent launch differs from the same kernels launched one by one"
    assert r["again"], "a second launch (its counters reset by the first's last program) differs from the first"
    assert r["rel_err"] <= TOL[dtype], r
    # 2 layers × (RMSNorm + GEMV in 3 K-parts of 5 column blocks, GEMV + residual): one body each, 4 launches
    assert (r["launches"], r["bodies"]) == (4, 2)
    if tasks_per_launch:
        assert r["tasks"] <= 4 * tasks_per_launch, r
    # layer 2's RMSNorm + GEMV waits for layer 1's GEMV (it reads its output, and overwrites what that one read);
    # layer 2's GEMV + residual for layer 1's (its residual) and layer 2's RMSNorm + GEMV
    assert r["waits"] == [[], [0], [0, 1], [1, 2]]
    # what prefetch=True would ask L2 for: the inputs no launch writes, each launch's weight and the step's input
    # (layer 1 reads it twice: its norm's input and its residual), not what an earlier launch writes
    assert r["weights"] == [2, 2, 1, 1]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_chained_split_kernel_and_its_combine_become_two_launches(dtype):
    r = run_interpreted("-m", "tests.superopt.runtime.persistent_interp_run", "chained", dtype)
    assert r["tails"] == 1, "the case's kernel did not run its combine chained"
    assert (r["launches"], r["waits"]) == (2, [[], [0]])  # the combine after every block of the split
    assert r["rel_err"] <= TOL[dtype], r


def _r(start, end):
    return (start, end)


def test_a_launch_waits_for_the_last_writer_and_for_readers_of_what_it_overwrites():
    h = _Hazards()
    assert h.add(0, reads=[_r(0, 10)], writes=[_r(100, 110)]) == []
    assert h.add(1, reads=[_r(100, 110)], writes=[_r(200, 210)]) == [0]         # read after write
    assert h.add(2, reads=[_r(0, 10)], writes=[_r(100, 110)]) == [0, 1]         # write after write and after read
    assert h.add(3, reads=[_r(300, 310)], writes=[_r(400, 410)]) == []          # touches nothing earlier
    assert h.add(4, reads=[_r(100, 110), _r(200, 210)], writes=[_r(500, 510)]) == [1, 2]


def test_overlapping_ranges_are_hazards_too():
    h = _Hazards()
    h.add(0, reads=[], writes=[_r(0, 64)])                    # a whole buffer
    assert h.add(1, reads=[_r(32, 62)], writes=[]) == [0]     # a view inside it
    assert h.add(2, reads=[], writes=[_r(60, 70)]) == [0, 1]  # a write straddling its end: after 0 and its reader
    assert h.add(3, reads=[_r(64, 66)], writes=[]) == [2]     # only the straddling write covers these bytes
    assert h.add(4, reads=[_r(70, 80)], writes=[]) == []
    assert h.add(5, reads=[], writes=[_r(0, 16)]) == [0]      # bytes 1 never read: only the writer


def test_the_persistent_kernel_compiles_for_sm90():
    """The real compiler (not the interpreter) takes the int64-to-pointer casts, the spin waits and the bodies."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from superopt.codegen.persistent import Body, function_text, render_persistent
    from superopt.codegen.triton import kernel_param_dtypes, render_triton
    from superopt.runtime.build import load_source
    from tests.fixtures.ugraphs import FIXTURES

    bodies, sources = [], []
    for fx in (FIXTURES["rmsnorm_matmul"](rows=3, hidden=90, out=70, split_k=3, dtype="float16"),
               FIXTURES["matmul_residual"](rows=3, hidden=70, out=90, dtype="float16")):
        tm = render_triton(fx.ugraph, blocks=True)
        for spec in tm.kernels:
            bodies.append(Body(f"{spec.name}_block", tuple(kernel_param_dtypes(spec, fx.ugraph).values())))
            sources.append(function_text(tm.source, f"{spec.name}_block", f"{spec.name}_block"))
    for prefetch in (False, True):
        mod = load_source("persistent_step", render_persistent("persistent_step", bodies, sources, prefetch))
        sig = {"tasks_ptr": "*i32", "launches_ptr": "*i64", "ptrs_ptr": "*i64", "waits_ptr": "*i64", "pf_ptr": "*i64",
               "done_ptr": "*i32", "ticket_ptr": "*i32", "N_TASKS": "constexpr"}
        src = ASTSource(mod.persistent_step, signature=sig, constexprs={"N_TASKS": 36, "N_LAUNCHES": 4})
        options = {"num_warps": 4, "num_stages": 2}
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
        counters = set(re.findall(r"atom\.global\.gpu\.(\w+)\.add\.u32", ptx))
        # the ticket, the waits and the counts (and the split-K tile counters): ordered at GPU scope, none relaxed
        assert counters and counters <= {"acquire", "release", "acq_rel"}, counters
        assert ("prefetch.global.L2" in ptx) == prefetch


@pytest.mark.parametrize("aligned", [False, True])
def test_aligned_pointers_give_the_bodies_vector_loads(aligned):
    """A body's pointer comes from an int64 table, so the compiler knows nothing of its alignment unless the
    runtime declares it (``Body.aligned``); declared, the GEMV's weight loads are 128-bit, as in the launched kernel."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from superopt.codegen.persistent import Body, function_text, render_persistent
    from superopt.codegen.triton import kernel_param_dtypes, render_triton
    from superopt.runtime.build import load_source
    from tests.fixtures.ugraphs import FIXTURES

    fx = FIXTURES["matmul_residual"](rows=1, hidden=256, out=128, dtype="bfloat16")
    tm = render_triton(fx.ugraph, blocks=True)
    spec = tm.kernels[0]
    dtypes = tuple(kernel_param_dtypes(spec, fx.ugraph).values())
    body = Body(f"{spec.name}_block", dtypes, (aligned,) * len(dtypes))
    source = render_persistent("persistent_step", [body], [function_text(tm.source, body.name, body.name)])
    mod = load_source("persistent_step", source)
    sig = {"tasks_ptr": "*i32", "launches_ptr": "*i64", "ptrs_ptr": "*i64", "waits_ptr": "*i64", "pf_ptr": "*i64",
           "done_ptr": "*i32", "ticket_ptr": "*i32", "N_TASKS": "constexpr"}
    src = ASTSource(mod.persistent_step, signature=sig, constexprs={"N_TASKS": 8, "N_LAUNCHES": 1})
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    assert bool(re.search(r"ld\.global(\.\w+)*\.v[24]\.b32", ptx)) == aligned
