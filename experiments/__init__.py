"""perflab's experiments, one module each (shipped as ``perflab.experiments``).

Each has a ``Config`` (a subclass of ``perflab.experiment.ExperimentConfig``) and ``run(ctx)``,
plus ``conf/experiment/<name>.yaml`` and ``conf/experiment/quick/<name>.yaml``; see
``perflab.config.contract`` for the optional hooks. They import what a user's experiment imports
(``perflab.experiment``) and only measure: what the book says of them is in ``perflab.book``.
Torch is imported inside functions, never at a module's top, so that checking a config never
waits for it.
"""
