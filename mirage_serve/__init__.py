"""mirage_serve: patch a Hugging Face decoder model with superoptimized kernels before generate()."""
__version__ = "0.1.0"
