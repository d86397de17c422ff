"""The decode fast path: owned static KV caches and CUDA-graph replay of decode steps in generate()."""
from .runner import DecodeRunner, decode_paths, install_decode_graphs, uninstall_decode_graphs

__all__ = ["DecodeRunner", "decode_paths", "install_decode_graphs", "uninstall_decode_graphs"]
