"""Probabilistic equivalence verification of μGraphs over finite fields (bound: equivalence.py)."""
from .degree import Deg, DegreeDomain, output_degrees, trial_bound
from .equivalence import FLOAT_TOL, Verdict, check_equivalent, check_inputs, field_trial, float_rel_error
from .fields import Field, default_field, is_prime, make_field, small_field

__all__ = [
    "FLOAT_TOL", "Deg", "DegreeDomain", "Field", "Verdict", "check_equivalent", "check_inputs",
    "default_field", "field_trial", "float_rel_error", "is_prime", "make_field", "output_degrees", "small_field",
    "trial_bound",
]
