"""Abstract expressions: a normal form of sums of products with reduction indices, the axioms it
decides, and the subexpression oracle the search prunes with."""
from .axioms import AXIOMS, Axiom
from .nf import ALL, NFStore, NotNormalizable
from .oracle import SubexprOracle
from .program import MODELED_OPS, ProgramIndex, Unsupported, analyze, apply_abstract, program_exprs

__all__ = ["ALL", "AXIOMS", "Axiom", "MODELED_OPS", "NFStore", "NotNormalizable", "ProgramIndex",
           "SubexprOracle", "Unsupported", "analyze", "apply_abstract", "program_exprs"]
