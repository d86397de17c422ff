"""Family adapters (one module per HF ``config.model_type``): which modules form which block."""
