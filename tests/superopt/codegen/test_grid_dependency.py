"""Programmatic dependent launch: a module rendered with ``pdl`` has every kernel wait for its
predecessor before anything else, then let its successor be scheduled; the launch (and the
warm-up) asks for PDL only for such a module."""
from __future__ import annotations

import re

import pytest

from superopt.codegen.triton import PDL_SIGNAL, PDL_WAIT, render_triton
from superopt.runtime.grid_dependency import applies, launch_options, supported
from superopt.runtime.interpreter import interpreting
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
def test_every_kernel_rendered_with_pdl_waits_then_signals_first_and_launchers_are_untouched(case):
    g = build(case, "bfloat16").ugraph
    plain, tm = render_triton(g), render_triton(g, pdl=True)
    assert tm.pdl and not plain.pdl and tm.kernels == plain.kernels
    bodies = _bodies(tm.source)
    assert set(bodies) == {k.name for k in tm.kernels}
    for name, body in bodies.items():
        assert body[:2] == [PDL_WAIT, PDL_SIGNAL], name
        assert body[2:] == _bodies(plain.source)[name]  # the kernel's own statements, unchanged
    assert tm.source.count(PDL_WAIT) == len(tm.kernels) and PDL_WAIT not in plain.source
    # nothing but the two lines differs (the launchers, the imports)
    assert [x for x in tm.source.splitlines() if x.strip() not in (PDL_WAIT, PDL_SIGNAL)] == plain.source.splitlines()


def test_pdl_only_from_sm90_and_only_while_enabled():
    import torch

    assert supported(90) and supported(100) and not supported(89) and not supported(80)
    assert not supported(90, enabled=False)  # PatchOptions(pdl=False)
    assert not applies(torch.device("cpu"))  # CPU tensors: Triton's interpreter or no Triton at all


def test_launch_options_ask_for_pdl_only_for_a_module_rendered_waiting():
    assert launch_options(False) == {} and launch_options(True) == {"launch_pdl": True}


@pytest.mark.slow
@pytest.mark.skipif(interpreting(), reason="kernels are interpreted in this process (TRITON_INTERPRET)")
@pytest.mark.parametrize("case", IDS)
def test_waiting_kernels_compile_for_sm90_with_the_wait_before_any_memory_access(case):
    from superopt.runtime.aot import aot_compile

    tm = render_triton(build(case, "bfloat16").ugraph, pdl=True)
    for k in aot_compile(tm, arch=90).values():
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        assert wait < ptx.index("griddepcontrol.launch_dependents")
        first_access = min(ptx.index(op) for op in ("ld.global", "st.global", "atom.global", "red.global")
                           if op in ptx)
        assert wait < first_access
