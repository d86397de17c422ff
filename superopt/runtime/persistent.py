"""Run the kernels of several compiled-graph calls as one persistent launch (``codegen.persistent``).

``PersistentRun([(compiled_graph, inputs), ...])`` takes what each call would launch
(``CompiledGraph.kernel_launches``: the kernels and the tensors they take), renders each distinct kernel once as a
device function of its block index, and fills the device tables the persistent kernel reads. Calling it runs
every block of every launch in one launch of ``programs`` programs and returns each call's outputs, which are
the compiled graphs' own buffers, as their own calls would leave them.

Dependencies come from memory, not from the graphs: a launch waits for the launches before it that last wrote
bytes it reads or writes, and for those that read bytes it writes since they were last written. So a buffer
reused by a later call of the same graph (two layers of one program) is ordered like any other.

Status (docs/persistent.md): correct on H100 and H200 and in Triton's interpreter, but slower than launching
the same kernels one by one (session 34: 0.63-0.86x); ``patch()`` does not use it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

import torch

from ..codegen.persistent import ALIGN, LAUNCH_FIELDS, Body, function_text, render_persistent
from ..codegen.triton import kernel_param_dtypes
from .build import load_source
from .compiled import CompiledGraph
from .interpreter import interpreting

_KERNEL = "persistent_step"


@dataclass
class _Span:
    """A byte range of device memory: the launch that last wrote it and those that read it since."""

    start: int
    end: int
    writer: int | None = None
    readers: list[int] = field(default_factory=list)


class _Hazards:
    """The launches a launch must wait for, from the byte ranges each one reads and writes."""

    def __init__(self):
        self.spans: list[_Span] = []

    def _over(self, r: tuple[int, int]) -> list[_Span]:
        return [s for s in self.spans if s.start < r[1] and r[0] < s.end]

    def add(self, j: int, reads: list[tuple[int, int]], writes: list[tuple[int, int]]) -> list[int]:
        deps: set[int] = set()
        for r in reads:  # read after write
            deps.update(s.writer for s in self._over(r) if s.writer is not None)
        for w in writes:  # write after write, write after read
            for s in self._over(w):
                deps.update(s.readers)
                if s.writer is not None:
                    deps.add(s.writer)
        for r in reads:
            same = [s for s in self._over(r) if (s.start, s.end) == r]
            for s in same or [self._new(r)]:
                s.readers.append(j)
        for w in writes:
            s = next((s for s in self._over(w) if (s.start, s.end) == w), None) or self._new(w)
            s.writer, s.readers = j, []
        deps.discard(j)
        return sorted(deps)

    def _new(self, r: tuple[int, int]) -> _Span:
        self.spans.append(_Span(*r))
        return self.spans[-1]


def segments(recorded: Sequence[tuple]) -> list[list[tuple]]:
    """A recording (``compiled.recording``) cut where other work ran (``compiled.mark``): the runs of calls a
    persistent launch each can take, in order, none empty."""
    out: list[list[tuple]] = [[]]
    for call in recorded:
        if call[0] is None:
            out.append([])
        else:
            out[-1].append(call)
    return [seg for seg in out if seg]


def _bytes(t: torch.Tensor) -> tuple[int, int]:
    return t.data_ptr(), t.data_ptr() + max(1, t.numel()) * t.element_size()


class PersistentRun:
    """Callable: ``run() -> [outputs of call 0, outputs of call 1, ...]``.

    ``programs``: persistent programs (default: one an SM). ``tasks_per_launch``: cut each launch into at most this
    many tasks of consecutive blocks (default: a task a block), so a task's ticket, table reads and waits are paid
    once for several blocks. The caller keeps this object alive as long as a CUDA graph that captured it may replay:
    the graph holds its tables by address only."""

    def __init__(self, calls: Sequence[tuple[CompiledGraph, Sequence[torch.Tensor]]], programs: int | None = None,
                 num_warps: int | None = None, num_stages: int | None = None, prefetch: bool = False,
                 tasks_per_launch: int | None = None, cache_dir=None):
        if not calls:
            raise ValueError("PersistentRun needs at least one (compiled graph, inputs) call")
        marked = next((what for cg, what in calls if cg is None), None)
        if marked is not None:
            raise ValueError(f"PersistentRun: other work ({marked}) ran between these calls; run each of "
                             f"persistent.segments(calls) as its own launch")
        if prefetch and interpreting():
            raise ValueError("PersistentRun(prefetch=True) asks L2 for the weights with a PTX instruction, which "
                             "Triton's interpreter cannot run; pass prefetch=False")
        device = calls[0][0].device
        self.outputs: list[list[torch.Tensor]] = []
        launches = []  # (graph, spec, tensors), in order
        for cg, inputs in calls:
            kernels, outs = cg.kernel_launches(*inputs)
            self.outputs.append(outs)
            launches += [(cg, spec, tensors) for spec, tensors in kernels]
        written = [_bytes(t) for _, spec, tensors in launches for t in tensors[len(spec.args):]]

        self.dependencies: list[list[int]] = []  # per launch, the launches it waits for
        self.weights: list[int] = []  # per launch, the inputs no launch writes (``prefetch``'s ranges)
        bodies: list[Body] = []
        sources: list[str] = []
        body_of: dict[tuple[str, str], int] = {}  # (graph's block source, kernel name) -> body index
        rows, tasks, ptrs, waits, pf = [], [], [], [], []
        hazards = _Hazards()
        warps, stages = 1, 1
        aligned: list[list[bool]] = []  # per body and pointer: every address passed there is ALIGN-byte aligned
        for j, (cg, spec, tensors) in enumerate(launches):
            key = (cg.blocks.source, spec.name)
            if key not in body_of:
                body_of[key] = len(bodies)
                name = f"{spec.name}_block{len(bodies)}"  # two graphs may name kernels alike
                bodies.append(Body(name, tuple(kernel_param_dtypes(spec, cg.graph).values())))
                sources.append(function_text(key[0], f"{spec.name}_block", name))
                aligned.append([True] * len(tensors))
            aligned[body_of[key]] = [a and t.data_ptr() % ALIGN == 0 for a, t in zip(aligned[body_of[key]], tensors)]
            reads = [_bytes(t) for t in tensors[:len(spec.args)]]
            deps = hazards.add(j, reads, [_bytes(t) for t in tensors[len(spec.args):]])
            self.dependencies.append(deps)
            weights = [r for r in dict.fromkeys(reads) if not any(w[0] < r[1] and r[0] < w[1] for w in written)]
            self.weights.append(len(weights))
            blocks = math.prod(spec.grid)
            chunk = -(-blocks // min(blocks, tasks_per_launch or blocks))
            n_tasks = -(-blocks // chunk)
            row = dict(body=body_of[key], first_task=len(tasks), grid_x=spec.grid[0], grid_y=spec.grid[1],
                       ptr_at=len(ptrs), wait_at=len(waits), waits=len(deps), blocks=blocks, pf_at=len(pf) // 2,
                       pf_count=len(weights), chunk=chunk, n_tasks=n_tasks)
            rows.append([row[f] for f in LAUNCH_FIELDS])
            tasks += [j] * n_tasks
            ptrs += [t.data_ptr() for t in tensors]
            waits += deps
            pf += [x for start, end in weights for x in (start, end - start)]
            launch = cg.launch.get(spec.name)  # (none for a chained consumer: its producer's)
            if launch is not None:
                warps, stages = max(warps, launch.num_warps), max(stages, launch.num_stages)
        self.launches, self.tasks = len(rows), len(tasks)
        self.bodies = [b.name for b in bodies]
        bodies = [replace(b, aligned=tuple(a)) for b, a in zip(bodies, aligned)]
        self.source = render_persistent(_KERNEL, bodies, sources, prefetch)
        self.kernel = getattr(load_source(_KERNEL, self.source, cache_dir=cache_dir), _KERNEL)
        i64 = dict(dtype=torch.int64, device=device)
        self._tables = (torch.tensor(tasks, dtype=torch.int32, device=device), torch.tensor(rows, **i64),
                        torch.tensor(ptrs, **i64), torch.tensor(waits or [0], **i64), torch.tensor(pf or [0], **i64))
        self._done = torch.zeros(len(rows), dtype=torch.int32, device=device)
        self._ticket = torch.zeros(2, dtype=torch.int32, device=device)  # the ticket, the programs that left
        if programs is None:
            programs = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
        self.programs = max(1, min(programs, self.tasks))
        self.num_warps, self.num_stages = num_warps or warps, num_stages or stages
        # the tables hold addresses: the inputs and the graphs (whose buffers the outputs are) live as long as this
        self.keep = [(cg, list(inputs)) for cg, inputs in calls]
        self.compiled = None  # Triton's compiled kernel, after the first call (its registers, spills, shared memory)

    def __call__(self) -> list[list[torch.Tensor]]:
        self.compiled = self.kernel[(self.programs,)](*self._tables, self._done, self._ticket, N_TASKS=self.tasks,
                                                      N_LAUNCHES=self.launches,
                                                      num_warps=self.num_warps, num_stages=self.num_stages)
        return self.outputs

