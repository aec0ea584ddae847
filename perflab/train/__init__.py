"""Data-parallel training (book 13.5/13.6): models, data, strategies, the loop, checkpoints."""
