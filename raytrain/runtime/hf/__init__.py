"""Hugging Face on a worker: models in ``train(ctx)`` jobs, a Trainer script's progress, rebuilding a model from its description."""
