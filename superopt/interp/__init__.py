"""Evaluate μGraphs over a Domain: float64 numpy, finite field, torch (``interp.torch_domain``)."""
from .domain import Domain
from .evaluate import apply_op, evaluate
from .numpy_domain import NumpyDomain

__all__ = ["Domain", "NumpyDomain", "apply_op", "evaluate"]
