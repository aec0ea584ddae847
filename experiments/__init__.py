"""perflab experiments: one module each, with a ``Config`` (subclass of
``perflab.schema.ExperimentConfig``) and ``run(ctx)``, plus ``conf/experiment/<name>.yaml``.
The first line of a module's docstring is its one-line summary in ``python -m perflab``."""
