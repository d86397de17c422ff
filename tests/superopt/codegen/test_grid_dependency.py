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


def _prefetch_lines(body: list[str]) -> list[str]:
    """The statements before the wait: the L2 prologue (``render_triton(l2_prefetch=True)``)."""
    return body[:body.index(PDL_WAIT)]


@pytest.mark.parametrize("case", IDS)
def test_l2_prefetch_asks_before_the_wait_for_the_large_inputs_only(case, monkeypatch):
    """Each kernel's statements before the wait ask L2 for its share of the graph inputs of at least
    ``L2_PREFETCH_MIN`` bytes and do nothing else; after the wait, the kernel is the plain PDL one. Without
    ``pdl`` the option renders nothing."""
    import math

    from superopt.codegen import triton as rt
    from superopt.ir import DTYPE_BYTES

    g = build(case, "bfloat16").ugraph
    sizes = {v.name: math.prod(v.type.shape) * DTYPE_BYTES[v.type.dtype] for v in g.inputs}
    least = sorted(sizes.values())[len(sizes) // 2]  # about half the inputs count as large
    monkeypatch.setattr(rt, "L2_PREFETCH_MIN", least)
    plain, tm = render_triton(g, pdl=True), render_triton(g, pdl=True, l2_prefetch=True)
    assert render_triton(g, l2_prefetch=True).source == render_triton(g).source
    bodies, plain_bodies = _bodies(tm.source), _bodies(plain.source)
    for spec in tm.kernels:
        body = bodies[spec.name]
        wait = body.index(PDL_WAIT)
        assert body[wait:] == plain_bodies[spec.name], spec.name  # after the wait: unchanged
        ahead = _prefetch_lines(body)
        large = [j for j, a in enumerate(spec.args) if sizes.get(a, 0) >= least]
        asked = sorted({int(j) for line in ahead for j in re.findall(r"\ba(\d+)_ptr\b", line)})
        assert asked == large, spec.name
        assert all("tl.load" not in line and "tl.store" not in line and "atomic" not in line for line in ahead)
        assert sum("prefetch.global.L2" in line for line in ahead) == len(large)


def test_l2_prefetch_skips_inputs_the_graph_may_write_in_place(monkeypatch):
    """An input the runtime lets the graph write (``in_place``) is not the weights: never asked for."""
    from superopt.codegen import triton as rt

    monkeypatch.setattr(rt, "L2_PREFETCH_MIN", 0)
    g = build("matmul_residual", "bfloat16").ugraph
    for written in ("w", "r"):
        tm = render_triton(g, in_place=frozenset({written}), pdl=True, l2_prefetch=True)
        for spec in tm.kernels:
            ahead = " ".join(_prefetch_lines(_bodies(tm.source)[spec.name]))
            for j, a in enumerate(spec.args):
                assert (f"a{j}_ptr" in ahead) == (a != written and a in {v.name for v in g.inputs}), (written, a)


@pytest.mark.parametrize("nbytes,blocks,cap", [(1 << 20, 7, 64 << 10), (1000, 3, 64 << 10), (333, 9, 128),
                                               (5 << 20, 132, 1 << 30), (128, 1, 0)])
def test_block_shares_are_whole_lines_in_order_and_cover_the_input_when_uncapped(nbytes, blocks, cap):
    from superopt.codegen.l2_prefetch import LINE, block_share

    stride, span = block_share(nbytes, blocks, cap)
    assert stride % LINE == 0 and span % LINE == 0 and LINE <= span <= stride
    assert stride * blocks >= nbytes  # every byte is some block's share
    if cap >= stride:
        assert span == stride
    else:
        assert span == max(LINE, cap // LINE * LINE)


@pytest.mark.slow
@pytest.mark.skipif(interpreting(), reason="kernels are interpreted in this process (TRITON_INTERPRET)")
def test_l2_prefetch_compiles_for_sm90_to_prefetches_before_the_wait(monkeypatch):
    from superopt.codegen import triton as rt
    from superopt.runtime.aot import aot_compile

    monkeypatch.setattr(rt, "L2_PREFETCH_MIN", 0)
    tm = render_triton(build("llama_qkv_wide", "bfloat16").ugraph, pdl=True, l2_prefetch=True)
    for k in aot_compile(tm, arch=90).values():
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        assert "prefetch.global.L2" in ptx[:wait]
        first_access = min(ptx.index(op) for op in ("ld.global", "st.global", "atom.global", "red.global")
                           if op in ptx)
        assert wait < first_access
