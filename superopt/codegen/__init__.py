"""Code generation: render μGraphs to GPU kernels (Triton in triton*.py, CUDA C++ in cuda*.py)."""
