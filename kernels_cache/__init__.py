"""Package data: the shipped warm kernel cache (searched μGraphs as text, no binaries), and the cost model's constants
fitted to the GPU timings those entries keep (``cost_fit.json``, read by ``mirage_serve.cost_fit``)."""
