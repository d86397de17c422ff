"""Programmatic dependent launch: a module rendered with ``pdl`` has every kernel wait for its
predecessor before anything else, then let its successor be scheduled; the launch (and the
warm-up) asks for PDL only for such a module."""
from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from superopt.codegen.triton import L2_PREFETCH_BLOCKS, PDL_SIGNAL, PDL_WAIT, render_triton
from superopt.ir.text import from_text
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


def _asks_l2(line: str) -> bool:
    return line.strip().startswith("tl.inline_asm_elementwise(") and "prefetch.global.L2" in line


@pytest.mark.parametrize("case", IDS)
def test_every_kernel_rendered_with_pdl_waits_then_signals_first_and_launchers_are_untouched(case):
    g = build(case, "bfloat16").ugraph
    plain, tm = render_triton(g), render_triton(g, pdl=True)
    assert tm.pdl and not plain.pdl and tm.kernels == plain.kernels
    bodies = _bodies(tm.source)
    assert set(bodies) == {k.name for k in tm.kernels}
    for name, body in bodies.items():
        wait = body.index(PDL_WAIT)
        assert body[wait + 1] == PDL_SIGNAL, name
        # before the wait: the block's indices and L2 requests for weights, nothing that reads or writes memory
        assert all(re.fullmatch(r"pid\d = tl.program_id\(\d\)", x) or _asks_l2(x) for x in body[:wait]), name
        # the kernel's own statements, unchanged
        assert [x for x in body if x not in (PDL_WAIT, PDL_SIGNAL) and not _asks_l2(x)] == \
            _bodies(plain.source)[name]
    assert tm.source.count(PDL_WAIT) == len(tm.kernels) and PDL_WAIT not in plain.source
    # nothing but those lines differs (the launchers, the imports)
    assert [x for x in tm.source.splitlines() if x.strip() not in (PDL_WAIT, PDL_SIGNAL)
            and not _asks_l2(x)] == plain.source.splitlines()


GEMV = """graph gemv
input %w : bfloat16[{rows},{cols}]
input %x : bfloat16[8,{cols}]
%t1 = customized(%w, %x) : bfloat16[8,{rows}] {{
  grid {grid},1,1 threads 128 forloop {loop}
  in %i0 = arg0 imap(0,-1,-1) fmap 1 : bfloat16[{tr},{tc}]
  in %i1 = arg1 imap(-1,-1,-1) fmap 1 : bfloat16[8,{tc}]
  %v0 = transpose(%i0) : bfloat16[{tc},{tr}]
  %v1 = matmul(%i1, %v0) : bfloat16[8,{tr}]
  %v2 = accum_sum(%v1) : bfloat16[8,{tr}]
  out %v2 omap(1,-1,-1) reduce none
}}
output %t1
"""


def _eval(expr: str, pid: int):
    """A rendered expression evaluated with numpy at block ``pid`` (of a 1-D grid), iteration 0, operand at 0."""
    tl = SimpleNamespace(arange=np.arange, minimum=np.minimum)
    return eval(expr.replace(".to(tl.int64)", ""), {"tl": tl, "pid0": pid, "i": 0, "a0_ptr": 0})


def _lines_of(expr: str, mask: str | None, pid: int, scale: int) -> set[int]:
    """The 128-byte lines (from the operand's start) of a rendered address expression: ``scale`` bytes an offset,
    lanes where ``mask`` holds."""
    at = np.asarray(_eval(expr, pid)) * scale
    keep = np.broadcast_to(_eval(mask, pid), at.shape) if mask else np.ones(at.shape, bool)
    return set((np.broadcast_to(at, keep.shape)[keep] // 128).tolist())


@pytest.mark.parametrize("rows, cols, grid, loop", [(512, 1024, 16, 4),    # rows of whole lines
                                                     (384, 1000, 24, 8),    # rows starting inside a line
                                                     (372, 1024, 31, 4),    # 12-row tiles, padded to 16
                                                     (2048, 512, 1024, 2)])  # too many blocks: none asks
def test_a_waiting_block_asks_l2_for_exactly_the_lines_of_its_first_weight_tile(rows, cols, grid, loop):
    g = from_text(GEMV.format(rows=rows, cols=cols, grid=grid, loop=loop, tr=rows // grid, tc=cols // loop))
    src = render_triton(g, pdl=True).source
    body = next(iter(_bodies(src).values()))
    asks = [x for x in body if _asks_l2(x)]
    if grid > L2_PREFETCH_BLOCKS:
        assert not asks
        return
    assert len(asks) == 1 and body.index(asks[0]) < body.index(PDL_WAIT)  # the weight, not the 16 KB activation
    addr = re.search(r'"=r,l", \[(.*)\], dtype=', asks[0]).group(1)
    load = next(x for x in body if x.split(" = ")[-1].startswith("tl.load(a0_ptr + "))
    m = re.fullmatch(r"\w+ = tl.load\(a0_ptr \+ (.*?)(?:, mask=(.*), other=0.0)?\)", load)
    for pid in range(grid):
        assert _lines_of(addr, None, pid, 1) == _lines_of(m.group(1), m.group(2), pid, 2), pid


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
