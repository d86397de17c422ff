"""The decode fast path: owned static KV caches and CUDA-graph replay of decode steps in generate()."""
from .runner import DecodeRunner, install_decode_graphs, uninstall_decode_graphs

__all__ = ["DecodeRunner", "install_decode_graphs", "uninstall_decode_graphs"]
