"""Probabilistic equivalence verification of μGraphs over finite fields."""
