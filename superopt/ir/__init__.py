"""The μGraph IR: op table, frozen graph types, shape rules, checker and canonical text form.

Importing this package is cheap: no torch, no triton, no numpy.
"""
from .check import GraphError, Variance, block_variance, check, shared_memory_bytes
from .graph import (GRID_AXES, BlockGraph, BlockInput, BlockOutput, KernelGraph, Node, TensorType,
                    Value, make_attrs)
from .ops import (ACCUM_OPS, BINARY_OPS, DTYPE_BYTES, DTYPES, OPAQUE_OPS, OPS, REDUCE_OPS, UNARY_OPS,
                  Category, Lax, OpInfo, op_info)
from .smem import SMEM_BUDGET, default_stages, launch_fits, triton_smem_bytes
from .shapes import ShapeError, broadcast_shapes, infer_type
from .text import ParseError, digest, from_text, layout, to_text
from .tiling import TilingError, input_tile_shape, output_shape, reduced_axes

__all__ = [
    "ACCUM_OPS", "BINARY_OPS", "DTYPE_BYTES", "DTYPES", "GRID_AXES", "OPAQUE_OPS", "OPS", "REDUCE_OPS",
    "SMEM_BUDGET", "UNARY_OPS", "BlockGraph", "BlockInput", "BlockOutput", "Category", "GraphError",
    "KernelGraph", "Lax", "Node", "OpInfo", "ParseError", "ShapeError", "TensorType", "TilingError",
    "Value", "Variance", "block_variance", "broadcast_shapes", "check", "digest", "from_text",
    "infer_type", "input_tile_shape", "layout", "make_attrs", "op_info", "output_shape", "reduced_axes",
    "shared_memory_bytes", "to_text", "default_stages", "launch_fits",
    "triton_smem_bytes",
]
