"""More than one process or machine: torch's elastic workers and SLURM."""
