"""Data-parallel training (book 13.5/13.6): data, strategies, the loop, checkpoints (the models: perflab.models)."""
