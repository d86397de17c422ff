"""superopt: a multi-level μGraph superoptimizer for tensor programs (after Mirage, arXiv 2405.05751).

Knows nothing of Hugging Face or serving. Layers, each importing only those before it:
``ir`` (graphs, text form, checker) ← ``interp`` (evaluate in a Domain) ← ``verify`` (finite-field
equivalence) ← ``search``; ``lax`` builds programs. Importing ``superopt`` is cheap.
"""
__version__ = "0.1.0"
