"""perflab's SLURM launcher for Hydra: ``perflab -m +launcher=slurm ...`` (conf/launcher/slurm.yaml);
its code in ``_launcher`` (a name Hydra's plugin scan skips), here only where Hydra's submitit
launcher is installed (``pip install 'perflab[launchers]'``). Without it, nothing: Hydra's scan of
every plugin at each start found a module that failed to import and warned about it on every run.
"""

try:
    from hydra_plugins.perflab_slurm._launcher import PerflabSlurmConf, PerflabSlurmLauncher
except ImportError as err:  # the launchers extra is not installed: no SLURM launcher, no warning
    if not str(getattr(err, "name", "") or err).startswith(("hydra_plugins.hydra_submitit_launcher", "submitit")):
        raise
else:
    __all__ = ["PerflabSlurmConf", "PerflabSlurmLauncher"]
