"""Code generation: render μGraphs to GPU kernels (Triton, in triton*.py)."""
