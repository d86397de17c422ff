"""The torch dtype of each μGraph dtype name (``ir.DTYPES``), for the runtime and its callers.

The IR names its dtypes as torch does (``"bfloat16"`` is ``torch.bfloat16``), so the table is
derived from the IR's list, never written out again.
"""
from __future__ import annotations

import torch

from ..ir import DTYPES

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}
DTYPE_NAMES: dict[torch.dtype, str] = {t: name for name, t in TORCH_DTYPES.items()}
