"""Programmatic dependent launch: a module rendered with ``pdl`` has every kernel wait for its
predecessor before anything else, then let its successor be scheduled; the launch (and the
warm-up) asks for PDL only for such a module."""
from __future__ import annotations

import re

import pytest

from superopt.codegen.common import identifier
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


def _early_and_rest(body: list[str]) -> tuple[list[str], list[str]]:
    wait = body.index(PDL_WAIT)
    assert body[wait + 1] == PDL_SIGNAL
    return body[:wait], body[wait + 2:]


@pytest.mark.parametrize("prefetch", [False, True])
@pytest.mark.parametrize("case", IDS)
def test_constant_inputs_load_before_the_wait_and_nothing_else_does(case, prefetch):
    """With ``constant`` (the weights), a kernel loads before its wait exactly its tiles of them that it holds
    before its first iteration, and nothing else touches memory before it; the kernel's other statements are the
    plain PDL kernel's, in the same order."""
    g = build(case, "bfloat16").ugraph
    names = sorted(v.name for v in g.inputs)
    constant = frozenset(names[1:])  # all inputs but one: an activation, whatever the case calls it
    kernels = {f"{identifier(g.name)}_k{i}" for i, n in enumerate(g.nodes) if n.op == "customized"}
    pf = kernels if prefetch else frozenset()
    plain, tm = render_triton(g, pf, pdl=True), render_triton(g, pf, pdl=True, constant=constant)
    assert render_triton(g, pf, constant=constant).source == render_triton(g, pf).source  # nothing without pdl
    bodies, plain_bodies = _bodies(tm.source), _bodies(plain.source)
    for spec in tm.kernels:
        node = g.nodes[spec.node_index]
        early, rest = _early_and_rest(bodies[spec.name])
        hoisted = [i for i in node.block.inputs if node.args[i.source] in constant
                   and (i.fmap == -1 or node.block.forloop == 1 or (prefetch and node.block.forloop > 1))]
        loads = [line for line in early if "tl.load(" in line]
        assert len(loads) == len(hoisted), spec.name
        for line in loads:  # only constant inputs' pointers
            used = {int(j) for j in re.findall(r"\ba(\d+)_ptr\b", line)}
            assert used and all(spec.args[j] in constant for j in used), line
        assert all(line.startswith("pid") or "tl.load(" in line for line in early), early
        assert not any("tl.store" in line or "atomic" in line for line in early)
        # the plain kernel's statements, less the hoisted loads, in order (names may be numbered otherwise)
        strip = [re.sub(r"\bv\d+_", "v_", line) for line in rest]
        want = [re.sub(r"\bv\d+_", "v_", line) for line in plain_bodies[spec.name][2:]]
        moved = {re.sub(r"\bv\d+_", "v_", line) for line in loads}
        assert [x for x in want if x not in moved and not x.startswith("pid")] == \
            [x for x in strip if not x.startswith("pid")], spec.name


@pytest.mark.slow
@pytest.mark.skipif(interpreting(), reason="kernels are interpreted in this process (TRITON_INTERPRET)")
@pytest.mark.parametrize("case", ["ntrans", "found_kv_split_k", "rmsnorm_matmul_split_k"])
def test_constant_loads_compile_for_sm90_before_the_wait_and_no_store_does(case):
    from superopt.runtime.aot import aot_compile

    g = build(case, "bfloat16").ugraph
    constant = frozenset(sorted(v.name for v in g.inputs)[1:])
    tm = render_triton(g, pdl=True, constant=constant)
    early = 0
    for k in aot_compile(tm, arch=90).values():
        ptx = k.asm["ptx"]
        wait = ptx.index("griddepcontrol.wait")
        assert wait < ptx.index("griddepcontrol.launch_dependents")
        assert not any(op in ptx[:wait] for op in ("st.global", "atom.global", "red.global"))
        early += "ld.global" in ptx[:wait]
    assert early  # some kernel of each case holds a constant tile whole
