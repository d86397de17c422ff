"""Package data: the shipped warm kernel cache (searched μGraphs as text, no binaries)."""
