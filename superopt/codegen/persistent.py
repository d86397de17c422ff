"""One persistent Triton kernel that runs a sequence of rendered kernels: a decode step in one launch.

Why: at 0.5-1B parameters a decode step is ~150 launches of 2-10 µs kernels, and the gaps and tails between
them cap the step well below the bandwidth floor (docs/persistent.md has the measured ceiling). Here every
kernel of the sequence keeps its own searched block graph, rendered as a device function of its block index
(``render_triton(blocks=True)``), and one launch of ``programs`` persistent programs runs them all:

- a *task* is ``chunk`` consecutive blocks of one launch (the launch's own ``chunk``: one block, or more so that
  the per-task work below is paid once for several blocks); tasks are numbered in launch order, so every task's
  dependencies have smaller numbers;
- each program takes the next task number from a ticket counter (an atomic add), waits until every launch
  its launch depends on has counted all its tasks done, runs the task's blocks one after another, and counts
  the task done in its launch's counter (a barrier, then a release add, as ``finish_sums`` orders its stores);
- a program holding a ticket is running, and it only waits on smaller tickets, which running programs hold:
  no deadlock, whatever the number of programs and whether they are all resident. A program takes its next
  ticket only when its task is done: taking it at the task's start (to hide the atomic's latency) measured
  1.7-1.8x slower on an H100 (session 34), since a launch then waits for a task whose program is still busy with
  another.

The kernel reads everything about the sequence from device tables the runtime fills
(``runtime.persistent``): per task its launch; per launch its body, first task, grid, where its pointers, its
waits and its weights' ranges start, how many of each, how many blocks, blocks a task and tasks; the pointers as
int64 addresses, cast back to the body parameter's element type; the waits as launch indices; the weights as
(address, bytes) pairs, which a task asks L2 for before it waits (``prefetch``). So one compiled kernel serves every layer of a model
(the layers differ in pointers only) and the source grows with the distinct bodies, not the launches.

This module writes text only, as ``codegen.triton`` does; ``runtime.persistent`` builds and launches it.
"""
from __future__ import annotations

from dataclasses import dataclass

# The int64 fields of one launch's row in the launch table, in order.
LAUNCH_FIELDS = ("body", "first_task", "grid_x", "grid_y", "ptr_at", "wait_at", "waits", "blocks", "pf_at", "pf_count",
                 "chunk", "n_tasks")
ALIGN = 16  # bytes: the alignment a body's pointer is declared to have where every address passed there has it
PF_LINES = 128  # 128-byte lines a block asks L2 for at a time, one a lane (``render_persistent(prefetch=True)``)
_PREFETCH_ASM = "mov.u32 $0, 0;\n\tprefetch.global.L2 [$1];"  # (the dummy result inline asm must give)

_RESET_BLOCK = 1024  # done counters the last program zeroes a store

_TL_TYPES = {"float32": "tl.float32", "float16": "tl.float16", "bfloat16": "tl.bfloat16", "float64": "tl.float64",
             "int32": "tl.int32", "int64": "tl.int64"}


@dataclass(frozen=True)
class Body:
    """A device function the persistent kernel calls: ``name(pid0, pid1, pid2, *pointers)``, each pointer to
    an element of ``dtypes[i]``; ``aligned[i]``: every address passed there is a multiple of 16 bytes.

    Why ``aligned``: a pointer argument of a launched kernel is specialised as 16-byte aligned when it is (Triton's
    JIT does this), which lets the compiler use 128-bit loads; a pointer cast from a table entry carries no such
    fact, and its loads compile to one element each (ld.global.b16 for bf16, seen in the sm_90 PTX). The
    runtime knows the addresses, so it states the alignment the JIT would have found."""

    name: str
    dtypes: tuple[str, ...]
    aligned: tuple[bool, ...] = ()


def render_persistent(name: str, bodies: list[Body], body_sources: list[str], prefetch: bool = False) -> str:
    """The module text: the bodies' device functions, then ``{name}`` (the persistent kernel) taking the
    tables (``tasks``, ``launches``, ``ptrs``, ``waits``, ``pf``), the per-launch ``done`` counters and the
    ``ticket`` counter and the exit counter after it (all zero before the first launch), and ``N_TASKS`` and
    ``N_LAUNCHES`` as constants. The last program to leave sets the counters back to zero for the next launch:
    zeroing them from the host would put two memset nodes beside each launch in a CUDA graph, which cost more
    than a small launch saves (session 34).

    ``prefetch``: before its waits, a task asks L2 for its share (1 / the launch's tasks) of each range in the
    ``pf`` table rows of its launch (address, bytes: the inputs no launch of the sequence writes, i.e. the
    weights), so the weights stream in while the launches before it finish. PTX ``prefetch.global.L2``: a GPU-only
    instruction, which Triton's interpreter cannot run."""
    width = len(LAUNCH_FIELDS)
    lines = ["import triton", "import triton.language as tl", "", *body_sources, "",
             "@triton.jit",
             f"def {name}(tasks_ptr, launches_ptr, ptrs_ptr, waits_ptr, pf_ptr, done_ptr, ticket_ptr,",
             "        N_TASKS: tl.constexpr, N_LAUNCHES: tl.constexpr):",
             "    t = tl.atomic_add(ticket_ptr, 1)",
             "    while t < N_TASKS:",
             "        j = tl.load(tasks_ptr + t).to(tl.int64)",
             f"        row = launches_ptr + j * {width}"]
    lines += [f"        {field} = tl.load(row + {i})" for i, field in enumerate(LAUNCH_FIELDS)]
    lines += ["        task = t - first_task  # of this launch: blocks task * chunk ... (task + 1) * chunk - 1"]
    if prefetch:
        lines += ["        for m in range(pf_count):  # this task's share of each weight, to L2, before the waits",
                  "            base = tl.load(pf_ptr + 2 * (pf_at + m))",
                  "            size = tl.load(pf_ptr + 2 * (pf_at + m) + 1)",
                  "            share = tl.cdiv(tl.cdiv(size, n_tasks), 128) * 128",
                  "            end = tl.minimum(size, (task + 1) * share)",
                  f"            for at in range(task * share, end, {PF_LINES * 128}):",
                  f"                lane = at + tl.arange(0, {PF_LINES}).to(tl.int64) * 128",
                  "                addr = base + tl.where(lane < end, lane, at)",
                  f"                tl.inline_asm_elementwise({_PREFETCH_ASM!r}, \"=r,l\", [addr], dtype=tl.int32,",
                  "                                          is_pure=False, pack=1)"]
    lines += ["        for w in range(waits):  # every launch this one depends on has all its tasks done",
              "            k = tl.load(waits_ptr + wait_at + w)",
              f"            need = tl.load(launches_ptr + k * {width} + {LAUNCH_FIELDS.index('n_tasks')}).to(tl.int32)",
              "            got = tl.atomic_add(done_ptr + k, 0, sem=\"acquire\", scope=\"gpu\")",
              "            while got < need:",
              "                got = tl.atomic_add(done_ptr + k, 0, sem=\"acquire\", scope=\"gpu\")",
              "        tl.debug_barrier()  # no thread of the block reads before the waits are over",
              "        for b in range(task * chunk, tl.minimum((task + 1) * chunk, blocks)):",
              "            pid0 = b % grid_x",
              "            pid1 = (b // grid_x) % grid_y",
              "            pid2 = b // (grid_x * grid_y)"]
    for i, body in enumerate(bodies):
        lines.append(f"            {'if' if i == 0 else 'elif'} body == {i}:")
        ptrs = [f"tl.load(ptrs_ptr + ptr_at + {m}).to(tl.pointer_type({_TL_TYPES[dt]}), bitcast=True)"
                for m, dt in enumerate(body.dtypes)]
        ptrs = [f"tl.multiple_of({p}, {ALIGN})" if m < len(body.aligned) and body.aligned[m] else p
                for m, p in enumerate(ptrs)]
        lines.append(f"                {body.name}(pid0, pid1, pid2, {', '.join(ptrs)})")
    lines += ["        tl.debug_barrier()  # every thread's stores before the count",
              "        tl.atomic_add(done_ptr + j, 1, sem=\"release\", scope=\"gpu\")",
              "        t = tl.atomic_add(ticket_ptr, 1)",
              "    # every other program has taken its last ticket before its exit count: the last one out resets",
              "    if tl.atomic_add(ticket_ptr + 1, 1) == tl.num_programs(0) - 1:",
              f"        for i in range(0, N_LAUNCHES, {_RESET_BLOCK}):",
              f"            offs = i + tl.arange(0, {_RESET_BLOCK})",
              "            tl.store(done_ptr + offs, 0, mask=offs < N_LAUNCHES)",
              "        tl.store(ticket_ptr + tl.arange(0, 2), 0)", ""]
    return "\n".join(lines)


def function_text(source: str, name: str, rename: str) -> str:
    """The text of the ``@triton.jit`` function ``name`` in a rendered module, renamed ``rename``."""
    start = source.index(f"@triton.jit\ndef {name}(")
    end = source.find("\n@triton.jit\n", start + 1)
    text = source[start:end if end >= 0 else len(source)].rstrip() + "\n"
    return text.replace(f"def {name}(", f"def {rename}(", 1)
