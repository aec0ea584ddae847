"""What a job is asked to do: the typed config, its composition, the experiments' contract and registry."""
