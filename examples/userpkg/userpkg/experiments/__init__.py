"""The package's perflab experiments (declared in pyproject.toml, group perflab.experiments)."""
