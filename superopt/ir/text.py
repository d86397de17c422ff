"""The canonical text form of a μGraph: exact round trip and a stable digest for cache keys.

    graph rmsnorm_matmul
    input %x : bfloat16[8,4096]
    %y = customized(%x, %w) : bfloat16[8,6144] {
      grid 1,48,1 threads 128 forloop 64
      in %tx = arg0 imap(-1,-1,-1) fmap 1 : bfloat16[8,64]
      in %tg = arg2 view(("slice",0,0,6144)) imap(-1,0,-1) fmap 1 : bfloat16[128,64]
      %s = matmul(%tx, %tw) : bfloat16[8,128]
      %acc = accum_sum(%s) : bfloat16[8,128]
      out %acc omap(-1,1,-1) reduce none
      fuse %a %b
    }
    output %y

Attributes follow the operands in brackets, sorted by key: ``[dim=1, keepdim=1]``. Strings are
double-quoted, floats use Python's shortest exact ``repr``, tuples are parenthesised.
``from_text(to_text(g)) == g`` holds for every graph (property-tested).
"""
from __future__ import annotations

import hashlib
import re

from .graph import VIEW_OPS, AttrValue, BlockGraph, BlockInput, BlockOutput, KernelGraph, Node, TensorType, Value

# ---------------------------------------------------------------- printing


def _fmt_attr(v: AttrValue) -> str:
    if isinstance(v, bool):
        raise TypeError("bool attributes are not allowed; use 0/1")
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        if '"' in v or "\n" in v:
            raise ValueError(f"string attribute {v!r} may not contain quotes or newlines")
        return f'"{v}"'
    if isinstance(v, tuple):
        return "(" + ",".join(_fmt_attr(x) for x in v) + ")"
    raise TypeError(f"unsupported attribute value {v!r}")


def _fmt_type(t: TensorType) -> str:
    return f"{t.dtype}[{','.join(map(str, t.shape))}]"


def _fmt_node(n: Node) -> str:
    outs = ", ".join(f"%{v.name}" for v in n.outs)
    args = ", ".join(f"%{a}" for a in n.args)
    attrs = ""
    if n.attrs:
        attrs = " [" + ", ".join(f"{k}={_fmt_attr(v)}" for k, v in n.attrs) + "]"
    types = ", ".join(_fmt_type(v.type) for v in n.outs)
    return f"{outs} = {n.op}({args}){attrs} : {types}"


def _fmt_block(b: BlockGraph, ind: str) -> list[str]:
    lines = [f"{ind}grid {','.join(map(str, b.grid))} threads {b.block_threads} forloop {b.forloop}"]
    for i in b.inputs:
        view = f" view{_fmt_attr(i.view)}" if i.view else ""
        lines.append(
            f"{ind}in %{i.value.name} = arg{i.source}{view} imap{_fmt_attr(i.imap)} fmap {i.fmap}"
            f" : {_fmt_type(i.value.type)}"
        )
    lines += [ind + _fmt_node(n) for n in b.nodes]
    for o in b.outputs:
        lines.append(f"{ind}out %{o.value} omap{_fmt_attr(o.omap)} reduce {o.reduce}")
    for g in b.thread_groups:
        lines.append(ind + "fuse " + " ".join(f"%{x}" for x in g))
    return lines


def to_text(g: KernelGraph) -> str:
    lines = [f"graph {g.name}"]
    lines += [f"input %{v.name} : {_fmt_type(v.type)}" for v in g.inputs]
    for n in g.nodes:
        if n.block is None:
            lines.append(_fmt_node(n))
        else:
            lines.append(_fmt_node(n) + " {")
            lines += _fmt_block(n.block, "  ")
            lines.append("}")
    lines.append("output " + " ".join(f"%{o}" for o in g.outputs))
    return "\n".join(lines) + "\n"


def layout(g: KernelGraph) -> str:
    """One line naming each launch of ``g``: a customized kernel as its grid, threads, for-loop and
    input tiles per iteration (``grid 256x1x1 t128 f16 [256] [16,256] [8,256]``), a library op by
    its name; views are left out. Enough to tell a search's candidates apart in a log or a cache
    entry's timings without the whole text."""
    parts = []
    for n in g.nodes:
        if n.block is None:
            if n.op not in VIEW_OPS:
                parts.append(n.op)
            continue
        b = n.block
        tiles = " ".join("[" + ",".join(map(str, i.value.type.shape)) + "]" for i in b.inputs)
        parts.append(f"grid {'x'.join(map(str, b.grid))} t{b.block_threads} f{b.forloop} {tiles}")
    return "; ".join(parts)


def digest(g: KernelGraph, length: int = 16) -> str:
    """A stable hex digest of the canonical text (names included; see ``rename_canonical``)."""
    return hashlib.sha256(to_text(g).encode()).hexdigest()[:length]


# ---------------------------------------------------------------- parsing


class ParseError(ValueError):
    pass


_TYPE = re.compile(r"^(\w+)\[([\d,]*)\]$")
_NODE = re.compile(r"^(?P<outs>%[\w.]+(?:, %[\w.]+)*) = (?P<op>\w+)\((?P<args>[^)]*)\)"
                   r"(?: \[(?P<attrs>.*)\])? : (?P<types>[^{]+?)(?P<brace> \{)?$")
_IN = re.compile(r"^in %([\w.]+) = arg(\d+)(?: view(\(.*\)))? imap(\([-\d,]+\)) fmap (-?\d+) : (.+)$")
_OUT = re.compile(r"^out %([\w.]+) omap(\([-\d,]+\)) reduce (\w+)$")
_GRID = re.compile(r"^grid (\d+),(\d+),(\d+) threads (\d+) forloop (\d+)$")


def _parse_type(s: str, line: str) -> TensorType:
    m = _TYPE.match(s.strip())
    if not m:
        raise ParseError(f"bad tensor type {s!r} in line: {line}")
    dims = tuple(int(x) for x in m.group(2).split(",") if x)
    return TensorType(dims, m.group(1))


def _split_top(s: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and quotes."""
    parts, depth, quoted, cur = [], 0, False, []
    for ch in s:
        if ch == '"':
            quoted = not quoted
        elif not quoted and ch in "([":
            depth += 1
        elif not quoted and ch in ")]":
            depth -= 1
        if ch == sep and depth == 0 and not quoted:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _parse_attr(s: str) -> AttrValue:
    s = s.strip()
    if s.startswith('"') and s.endswith('"'):
        return s[1:-1]
    if s.startswith("(") and s.endswith(")"):
        inner = s[1:-1]
        return tuple(_parse_attr(x) for x in _split_top(inner)) if inner else ()
    if re.fullmatch(r"-?\d+", s):
        return int(s)
    try:
        return float(s)
    except ValueError:
        raise ParseError(f"bad attribute value {s!r}") from None


def _parse_node(line: str) -> tuple[Node, bool]:
    m = _NODE.match(line)
    if not m:
        raise ParseError(f"cannot parse node line: {line}")
    names = [x.strip()[1:] for x in m.group("outs").split(",")]
    types = [_parse_type(t, line) for t in _split_top(m.group("types"))]
    if len(names) != len(types):
        raise ParseError(f"{len(names)} results but {len(types)} types in line: {line}")
    args = tuple(a.strip()[1:] for a in m.group("args").split(",") if a.strip())
    attrs = ()
    if m.group("attrs"):
        pairs = []
        for kv in _split_top(m.group("attrs")):
            k, _, v = kv.strip().partition("=")
            pairs.append((k, _parse_attr(v)))
        attrs = tuple(pairs)
    outs = tuple(Value(n, t) for n, t in zip(names, types))
    return Node(m.group("op"), args, outs, attrs), bool(m.group("brace"))


def _parse_block(lines: list[str], pos: int) -> tuple[BlockGraph, int]:
    m = _GRID.match(lines[pos].strip())
    if not m:
        raise ParseError(f"expected 'grid x,y,z threads T forloop F', got: {lines[pos].strip()}")
    gx, gy, gz, threads, forloop = (int(x) for x in m.groups())
    inputs, nodes, outputs, groups = [], [], [], []
    pos += 1
    while pos < len(lines):
        line = lines[pos].strip()
        pos += 1
        if line == "}":
            return BlockGraph((gx, gy, gz), threads, forloop, tuple(inputs), tuple(nodes),
                              tuple(outputs), tuple(groups)), pos
        if line.startswith("in "):
            mi = _IN.match(line)
            if not mi:
                raise ParseError(f"cannot parse block input: {line}")
            imap = _parse_attr(mi.group(4))
            view = _parse_attr(mi.group(3)) if mi.group(3) else ()
            inputs.append(BlockInput(Value(mi.group(1), _parse_type(mi.group(6), line)),
                                     int(mi.group(2)), imap, int(mi.group(5)), view))
        elif line.startswith("out "):
            mo = _OUT.match(line)
            if not mo:
                raise ParseError(f"cannot parse block output: {line}")
            outputs.append(BlockOutput(mo.group(1), _parse_attr(mo.group(2)), mo.group(3)))
        elif line.startswith("fuse "):
            groups.append(tuple(x[1:] for x in line.split()[1:]))
        else:
            node, brace = _parse_node(line)
            if brace:
                raise ParseError(f"customized ops cannot nest inside a block graph: {line}")
            nodes.append(node)
    raise ParseError("unterminated block graph (missing '}')")


def from_text(text: str) -> KernelGraph:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if not lines or not lines[0].startswith("graph "):
        raise ParseError("text must start with 'graph <name>'")
    name = lines[0][6:].strip()
    inputs, nodes, outputs = [], [], None
    pos = 1
    while pos < len(lines):
        line = lines[pos].strip()
        pos += 1
        if line.startswith("input "):
            nm, _, ty = line[6:].partition(" : ")
            inputs.append(Value(nm.strip()[1:], _parse_type(ty, line)))
        elif line.startswith("output"):
            outputs = tuple(x[1:] for x in line.split()[1:])
        else:
            node, brace = _parse_node(line)
            if brace:
                block, pos = _parse_block(lines, pos)
                node = Node(node.op, node.args, node.outs, node.attrs, block)
            nodes.append(node)
    if outputs is None:
        raise ParseError("missing 'output' line")
    return KernelGraph(tuple(inputs), tuple(nodes), outputs, name)
