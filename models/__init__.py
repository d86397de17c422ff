"""Package data: the registry of popular checkpoints (their config.json facts, no weights)."""
