"""The torch dtype of each μGraph dtype name (``ir.DTYPE_BYTES``: values and int64 positions), for the runtime.

The IR names its dtypes as torch does (``"bfloat16"`` is ``torch.bfloat16``), so the table is
derived from the IR's list, never written out again.
"""
from __future__ import annotations

import torch

from ..ir import DTYPE_BYTES

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPE_BYTES}
DTYPE_NAMES: dict[torch.dtype, str] = {t: name for name, t in TORCH_DTYPES.items()}
