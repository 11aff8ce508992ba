"""A rehearsal of a job's preemptions: plan the moments (plan.py), run the straight and interrupted runs
(runs.py, interrupt.py), compare them (compare.py, causes.py) and report (report.py); pipeline.py drives them.
Torch-free until a comparison loads checkpoints."""
