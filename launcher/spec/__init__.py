"""The job spec: its models, reading and validating spec files, ``--set`` overrides, the generated
reference. Torch-free; everything above it (run directories, submission, the job, the verbs) imports
its public names from here.
"""

from .loading import load_spec, read_spec_data, validate_spec_data
from .models import JobSpec, SpecError, json_schema
from .overrides import load_spec_with
from .sections import Requeue, Resources, Slurm

__all__ = ["JobSpec", "Requeue", "Resources", "Slurm", "SpecError", "json_schema", "load_spec", "load_spec_with",
           "read_spec_data", "validate_spec_data"]
