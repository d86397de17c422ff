"""Programmatic dependent launch (sm_90+): a kernel's launch overlaps the tail of the one before it.

A decode step is hundreds of small kernels back to back. Between two of them the GPU idles while the
second is launched and its blocks are scheduled (about a microsecond, in a CUDA-graph replay too). With
programmatic dependent launch (PDL) a kernel launched with the attribute may be scheduled as soon as
every block of its predecessor has signalled ``griddepcontrol.launch_dependents`` (or exited); it then
waits in ``griddepcontrol.wait`` until the predecessor has completed and its writes are visible.

``with_grid_dependency(source)`` makes the wait, then the signal, the first statements of every
``@triton.jit`` kernel of a generated module. Waiting before anything else is what keeps it safe next
to any neighbour: the kernel reads and writes nothing before its predecessor is complete, so a
predecessor that never signals (a torch or cuBLAS kernel) is simply waited for, and a successor
launched without the attribute is ordered by the stream as always. Signalling right after the wait
lets the next kernel's blocks be resident, launched and waiting, when this one ends; at most two
kernels are in flight. Both instructions are no-ops in a kernel launched without the attribute
(``torch.compile``'s launches), so the same binary serves either launch.

Two placements of the signal (``set_mode``), measured against each other on the GPU:

* ``early`` (the default): wait, then signal, as the kernel's first statements.
* ``late``: the kernel first asks L2 for the tiles the first iterations of its main loop will load
  (``prefetch.global.L2``: a hint that reads nothing into registers and cannot fault a kernel, and
  L2 is where every write lands, so a line the predecessor writes afterwards is simply updated),
  then waits, and signals only after that loop. The successor's blocks are then scheduled while this
  kernel's blocks finish (not for its whole run, where they hold registers its own later blocks
  could use), and its first weight tiles are on their way from DRAM before this kernel is complete.
  A kernel without a loop signals right after its wait, as with ``early``.

``launch_options(fn)`` is what a launch (and a warm-up, whose compile options must match it) adds for
a kernel that carries the wait: ``{"launch_pdl": True}``.
"""
from __future__ import annotations

import ast
import functools

WAIT = "tl.extra.cuda.gdc_wait()"
SIGNAL = "tl.extra.cuda.gdc_launch_dependents()"
PREFETCH = '_ = tl.inline_asm_elementwise("prefetch.global.L2 [$1];", "=r,l", [{ptrs}], dtype=tl.int32, is_pure=False, pack=1)'
MIN_ARCH = 90  # griddepcontrol is a Hopper instruction
MODES = ("off", "early", "late")
THIN = 8  # elements per prefetched address along a contiguous index range
PREFETCH_ITERATIONS = 2  # of the main loop: a few KB per block, the loads one iteration keeps in flight
_mode = "early"


def with_grid_dependency(source: str, mode: str | None = None) -> str:
    """``source`` with every kernel waiting for its predecessor before it reads or writes anything,
    and signalling its successor where ``mode`` (default: the current ``set_mode``; "off" counts as
    "early") places it; a kernel that already waits is left as it is."""
    late = (mode or _mode) == "late"
    lines = source.splitlines(keepends=True)
    inserts: list[tuple[int, list[str]]] = []  # (line index, lines to insert before it)
    for fn in _kernels(ast.parse(source)):
        if any(_is_call(n, WAIT) for n in ast.walk(fn)):
            continue
        pad = " " * fn.body[0].col_offset
        main = _main_part(fn) if late else None
        if main is None:
            inserts.append((fn.body[0].lineno - 1, [f"{pad}{WAIT}\n", f"{pad}{SIGNAL}\n"]))
            continue
        setup = 0  # the program ids come first: the prefetched addresses use them
        while _is_program_id(fn.body[setup]):
            setup += 1
        known = {a.arg for a in fn.args.args} | {t.id for st in fn.body[:setup] for t in st.targets}
        loop = main if isinstance(main, ast.For) else None
        ahead = fn.body[setup:fn.body.index(main) + (loop is None)]  # top-level loads up to the loop
        addresses = [a for st in ahead for a in _addresses(st, known)]
        if loop is not None:
            addresses += _loop_addresses(loop, known)
        prefetches = [f"{pad}{PREFETCH.format(ptrs=a)}\n" for a in addresses]
        inserts.append((fn.body[setup].lineno - 1, prefetches + [f"{pad}{WAIT}\n"]))
        inserts.append((main.end_lineno, [f"{pad}{SIGNAL}\n"]))
    for at, new in sorted(inserts, key=lambda x: x[0], reverse=True):
        lines[at:at] = new
    return "".join(lines)


def _kernels(tree: ast.Module) -> list[ast.FunctionDef]:
    return [n for n in tree.body if isinstance(n, ast.FunctionDef)
            and any(ast.unparse(d) == "triton.jit" for d in n.decorator_list)]


def _is_call(node: ast.AST, text: str) -> bool:
    return isinstance(node, ast.Call) and ast.unparse(node) == text


def _main_part(fn: ast.FunctionDef) -> ast.stmt | None:
    """Where a kernel's loads end: its first top-level loop, else its last top-level statement that
    loads (None: a kernel that loads nothing)."""
    loop = next((st for st in fn.body if isinstance(st, ast.For)), None)
    if loop is not None:
        return loop
    loads = [st for st in fn.body if any(isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.load"
                                         for n in ast.walk(st))]
    return loads[-1] if loads else None


def _is_program_id(st: ast.stmt) -> bool:
    return (isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name)
            and isinstance(st.value, ast.Call) and ast.unparse(st.value.func) == "tl.program_id")


def _loop_addresses(loop: ast.For, known: set[str]) -> list[str]:
    """The addresses ``_addresses`` finds in ``loop``, at each of its first iterations."""
    it = loop.iter
    if not (isinstance(loop.target, ast.Name) and isinstance(it, ast.Call) and ast.unparse(it.func) == "range"
            and len(it.args) == 1 and isinstance(it.args[0], ast.Constant)):
        return []
    var = loop.target.id
    return [ast.unparse(_Substitute(var, k).visit(ast.parse(a, mode="eval")).body)
            for a in _addresses(loop, known | {var}) for k in range(min(PREFETCH_ITERATIONS, it.args[0].value))]


def _addresses(node: ast.AST, known: set[str]) -> list[str]:
    """The addresses of the unmasked loads in ``node`` that are expressions of ``known`` names only
    (a load whose address needs anything the kernel computed, or that has a mask, is left out)."""
    out = []
    for n in ast.walk(node):
        if (isinstance(n, ast.Call) and ast.unparse(n.func) == "tl.load" and n.args and not n.keywords
                and {x.id for x in ast.walk(n.args[0]) if isinstance(x, ast.Name)} <= known | {"tl"}):
            out.append(ast.unparse(_thin(n.args[0])))
    return out


def _thin(node: ast.expr) -> ast.expr:
    """The address expression ``node`` with each index range of stride one (a ``tl.arange`` reached
    through additions only) taking every ``THIN``-th element: one prefetch per 16 bytes of bf16
    (what a thread's vector load covers), not one per element."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return ast.BinOp(_thin(node.left), ast.Add(), _thin(node.right))
    if isinstance(node, ast.Subscript):
        return ast.Subscript(_thin(node.value), node.slice, node.ctx)
    if (isinstance(node, ast.Call) and ast.unparse(node.func) == "tl.arange" and len(node.args) == 2
            and all(isinstance(a, ast.Constant) for a in node.args) and node.args[0].value == 0
            and node.args[1].value % THIN == 0 and node.args[1].value > THIN):
        return ast.parse(f"(tl.arange(0, {node.args[1].value // THIN}) * {THIN})", mode="eval").body
    return node


class _Substitute(ast.NodeTransformer):
    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(self.value) if node.id == self.name else node


def set_mode(mode: str) -> None:
    """How kernels built (and decode attention launched) from now on use PDL: one of ``MODES``."""
    global _mode
    if mode not in MODES:
        raise ValueError(f"grid_dependency.set_mode: expected one of {MODES}, got {mode!r}")
    _mode = mode


def supported(arch: int) -> bool:
    """Whether kernels for a GPU of compute capability ``arch`` (90 for sm_90) use programmatic
    dependent launch: the GPU has it and it is not switched off (``set_mode``)."""
    return _mode != "off" and arch >= MIN_ARCH


def applies(device) -> bool:
    """Whether kernels built for the torch ``device`` use PDL: a CUDA GPU of sm_90+, kernels compiled
    (not run by Triton's interpreter), PDL not switched off."""
    from .build import interpreting

    return device.type == "cuda" and not interpreting() and _triton_has_it() and supported(_arch(device))


@functools.lru_cache(maxsize=None)
def _triton_has_it() -> bool:
    """Triton ≥ 3.4 has the two instructions and the ``launch_pdl`` option; an older one builds without."""
    import triton.language as tl

    return hasattr(tl.extra.cuda, "gdc_wait") and hasattr(tl.extra.cuda, "gdc_launch_dependents")


@functools.lru_cache(maxsize=None)
def _arch(device) -> int:
    import torch

    major, minor = torch.cuda.get_device_capability(device)
    return 10 * major + minor


def launch_options(fn) -> dict:
    """Extra launch (and warm-up) options of the Triton JIT function ``fn``: PDL where it waits."""
    return {"launch_pdl": True} if WAIT in getattr(fn, "src", "") else {}
