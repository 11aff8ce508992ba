"""A sweep's verbs as a whole (verbs.py), its members handed over as SLURM job arrays (slurm.py) or by a
local scheduler (local.py). Torch-free."""
