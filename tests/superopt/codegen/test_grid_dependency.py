"""Programmatic dependent launch: every generated kernel waits for its predecessor before anything
else, then lets its successor be scheduled; the launch (and the warm-up) asks for PDL only then."""
from __future__ import annotations

import dataclasses
import re

import pytest

from superopt.codegen.triton import render_triton
from superopt.runtime.build import interpreting, load_module
from superopt.runtime.grid_dependency import SIGNAL, WAIT, launch_options, supported, with_grid_dependency
from tests.superopt.codegen.triton_cases import CASES, build

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
    src = with_grid_dependency(tm.source)
    bodies = _bodies(src)
    assert set(bodies) == {k.name for k in tm.kernels}
    for name, body in bodies.items():
        assert body[:2] == [WAIT, SIGNAL], name
        assert body[2:] == _bodies(tm.source)[name]  # the kernel's own statements, unchanged
    assert src.count(WAIT) == len(tm.kernels)
    assert with_grid_dependency(src) == src  # idempotent: a cached, already built source stays as it is
    # nothing but the added lines differs (the launchers, the imports)
    assert [x for x in src.splitlines() if x.strip() not in (WAIT, SIGNAL)] == tm.source.splitlines()


def test_pdl_only_from_sm90_and_only_while_enabled():
    from superopt.runtime.grid_dependency import set_enabled

    import torch

    from superopt.runtime.grid_dependency import applies

    assert supported(90) and supported(100) and not supported(89) and not supported(80)
    assert not applies(torch.device("cpu"))  # CPU tensors: Triton's interpreter or no Triton at all
    set_enabled(False)  # MIRAGE_SERVE_PDL=0, applied by patch()
    try:
        assert not supported(90)
    finally:
        set_enabled(True)


def test_launch_options_ask_for_pdl_only_for_a_kernel_that_waits():
    tm = render_triton(build(IDS[0], "bfloat16").ugraph)
    plain = getattr(load_module(tm), tm.kernels[0].name)
    tm2 = dataclasses.replace(tm, source=with_grid_dependency(tm.source))
    waiting = getattr(load_module(tm2), tm.kernels[0].name)
    assert launch_options(plain) == {} and launch_options(waiting) == {"launch_pdl": True}


@pytest.mark.slow
@pytest.mark.skipif(interpreting(), reason="kernels are interpreted in this process (TRITON_INTERPRET)")
@pytest.mark.parametrize("case", IDS)
def test_waiting_kernels_compile_for_sm90_with_the_wait_before_any_memory_access(case):
    from superopt.runtime.aot import aot_compile

    tm = render_triton(build(case, "bfloat16").ugraph)
    tm = dataclasses.replace(tm, source=with_grid_dependency(tm.source))
    for k in aot_compile(tm, arch=90).values():
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        assert wait < ptx.index("griddepcontrol.launch_dependents")
        first_access = min(ptx.index(op) for op in ("ld.global", "st.global", "atom.global", "red.global")
                           if op in ptx)
        assert wait < first_access
