"""Programmatic dependent launch: every generated kernel waits for its predecessor before anything
else, then lets its successor be scheduled; the launch (and the warm-up) asks for PDL only then."""
from __future__ import annotations

import dataclasses
import re

import pytest

from superopt.codegen.triton import render_triton
from superopt.runtime.build import interpreting, load_module
from superopt.runtime.grid_dependency import SIGNAL, WAIT, launch_options, supported, with_grid_dependency
from tests.codegen.triton_cases import CASES, build

IDS = [c[0] for c in CASES]


def _bodies(source: str) -> dict[str, list[str]]:
    """Per @triton.jit kernel of ``source``: its body lines."""
    out, name = {}, None
    for line in source.splitlines():
        m = re.match(r"def (\w+)\(", line)
        if m:
            name = m.group(1) if prev == "@triton.jit" else None
            if name:
                out[name] = []
        elif name and line.startswith("    "):
            out[name].append(line.strip())
        elif name and line.strip():
            name = None
        prev = line
    return out


@pytest.mark.parametrize("case", IDS)
def test_every_kernel_waits_then_signals_first_and_launchers_are_untouched(case):
    tm = render_triton(build(case, "bfloat16").ugraph)
    src = with_grid_dependency(tm.source, "early")
    bodies = _bodies(src)
    assert set(bodies) == {k.name for k in tm.kernels}
    for name, body in bodies.items():
        assert body[:2] == [WAIT, SIGNAL], name
        assert body[2:] == _bodies(tm.source)[name]  # the kernel's own statements, unchanged
    assert src.count(WAIT) == len(tm.kernels)
    assert with_grid_dependency(src) == src  # idempotent: a cached, already built source stays as it is
    # nothing but the added lines differs (the launchers, the imports)
    assert [x for x in src.splitlines() if x.strip() not in (WAIT, SIGNAL)] == tm.source.splitlines()


def _is_prefetch(line: str) -> bool:
    return line.strip().startswith("_ = tl.inline_asm_elementwise(\"prefetch.global.L2")


@pytest.mark.parametrize("case", IDS)
def test_late_mode_prefetches_then_waits_and_signals_after_the_loads(case):
    """"late": L2 prefetches of the loop's first tiles, then the wait, before anything the kernel
    computes; the signal after the main loop (or the last top-level load); nothing else changes."""
    tm = render_triton(build(case, "bfloat16").ugraph)
    src = with_grid_dependency(tm.source, "late")
    for name, body in _bodies(src).items():
        wait = body.index(WAIT)
        setup = [x for x in body[:wait] if not _is_prefetch(x)]
        assert all(re.fullmatch(r"pid\d = tl\.program_id\(\d\)", x) for x in setup), (name, setup)
        assert body.count(SIGNAL) == 1 and body.index(SIGNAL) > wait
        loops = [j for j, x in enumerate(body) if x.startswith("for ")]
        if loops:  # after the first loop (its body: the lines between it and the signal)
            assert body.index(SIGNAL) > loops[0], name
        else:  # after the last load
            assert "tl.load" not in " ".join(body[body.index(SIGNAL):]), name
        assert not any(_is_prefetch(x) for x in body[wait:])
    assert [x for x in src.splitlines() if x.strip() not in (WAIT, SIGNAL) and not _is_prefetch(x)] == \
        tm.source.splitlines()
    assert with_grid_dependency(src, "late") == src


def test_late_mode_prefetches_the_first_tiles_of_a_gemv_loop():
    """The decode GEMV (K in a for-loop): its weight and activation tiles at iterations 0 and 1,
    one address per 8 elements along the contiguous range, are prefetched before the wait."""
    tm = render_triton(build("gemv_nk", "bfloat16").ugraph)
    src = with_grid_dependency(tm.source, "late")
    prefetches = [x for x in src.splitlines() if _is_prefetch(x)]
    loads = [x for x in tm.source.splitlines() if "tl.load(" in x]
    assert len(prefetches) == 2 * len([x for x in loads if "mask=" not in x]) > 0
    assert all("* 8" in x or "tl.arange(0, 8)" in x or "tl.arange(0, 1)" in x or "tl.arange" not in x
               for x in prefetches), prefetches


def test_pdl_only_from_sm90_and_only_while_enabled():
    from superopt.runtime.grid_dependency import set_mode

    import torch

    from superopt.runtime.grid_dependency import applies

    assert supported(90) and supported(100) and not supported(89) and not supported(80)
    assert not applies(torch.device("cpu"))  # CPU tensors: Triton's interpreter or no Triton at all
    set_mode("off")  # MIRAGE_SERVE_PDL=0, applied by patch()
    try:
        assert not supported(90)
        with pytest.raises(ValueError, match="expected one of"):
            set_mode("sometimes")
    finally:
        set_mode("early")


def test_launch_options_ask_for_pdl_only_for_a_kernel_that_waits():
    tm = render_triton(build(IDS[0], "bfloat16").ugraph)
    plain = getattr(load_module(tm), tm.kernels[0].name)
    tm2 = dataclasses.replace(tm, source=with_grid_dependency(tm.source))
    waiting = getattr(load_module(tm2), tm.kernels[0].name)
    assert launch_options(plain) == {} and launch_options(waiting) == {"launch_pdl": True}


@pytest.mark.slow
@pytest.mark.skipif(interpreting(), reason="kernels are interpreted in this process (TRITON_INTERPRET)")
@pytest.mark.parametrize("mode", ["early", "late"])
@pytest.mark.parametrize("case", IDS)
def test_waiting_kernels_compile_for_sm90_with_the_wait_before_any_memory_access(case, mode):
    """In the sm_90 PTX: nothing but L2 prefetches before the wait; with "late", the signal after
    every global load (ld.global, or the cp.async of a pipelined loop)."""
    from superopt.runtime.aot import aot_compile

    tm = render_triton(build(case, "bfloat16").ugraph)
    tm = dataclasses.replace(tm, source=with_grid_dependency(tm.source, mode))
    for k in aot_compile(tm, arch=90).values():
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        signal = ptx.index("griddepcontrol.launch_dependents")
        assert wait < signal
        accesses = [m.start() for m in re.finditer(r"\b(ld|st|atom|red)\.global|cp\.async\.(ca|cg)", ptx)]
        assert accesses and wait < min(accesses)
        assert all(m.start() < wait for m in re.finditer("prefetch", ptx))
        if mode == "late":
            loads = [m.start() for m in re.finditer(r"\bld\.global|cp\.async\.(ca|cg)", ptx)]
            assert signal > max(loads)
        else:
            assert "prefetch" not in ptx
