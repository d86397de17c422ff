"""Build, launch and profile μGraphs on a device (torch at the edge: importing this needs torch)."""
from .compiled import CompiledGraph, compile_graph
from .profile import ProfileResult, profile_candidates

__all__ = ["CompiledGraph", "ProfileResult", "compile_graph", "profile_candidates"]
