"""perflab's experiments, one module each (shipped as ``perflab.experiments``).

Each has a ``Config`` (a subclass of ``perflab.config.schema.ExperimentConfig``) and ``run(ctx)``,
plus ``conf/experiment/<name>.yaml`` and ``conf/experiment/quick/<name>.yaml``; see
``perflab.config.registry`` for the optional parts. Torch is imported inside functions, never at a
module's top, so that checking a config never waits for it.
"""
