"""The ``sweep`` section of a job spec: many runs of one job that differ in a few fields. Torch-free.

```yaml
sweep:
  grid: {config.lr: [0.001, 0.003], config.seed: [0, 1]}   # the cartesian product: 4 members
  # or: members: [{config.lr: 0.001}, {config.lr: 0.01, resources.nodes: 2}]
  max_parallel: 2                                          # at most 2 members run at once
```

Each key is a dotted field path, as in ``--set KEY=VALUE``; each value one scalar. The members are
expanded and validated by launcher/spec/sweep.py; this module holds the model only (launcher/spec/models.py
imports it, so it imports nothing of the spec).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    model_validator,
)
from pydantic_core import PydanticCustomError


def _one_scalar(value: Any) -> Any:
    """A list or mapping is refused once, saying why (not once per scalar type it failed to be)."""
    if isinstance(value, (list, dict)):
        raise PydanticCustomError("sweep_scalar", "a sweep value is one scalar (a string, number, boolean or null), "
                                  "not a {kind}; give scalars only",
                                  {"kind": "list" if isinstance(value, list) else "mapping"})
    return value


Scalar = Annotated[StrictBool | StrictInt | StrictFloat | StrictStr | None, BeforeValidator(_one_scalar)]
# Fields a member may not change: each member's run directory is derived from the sweep's, and a member
# is one run, not a sweep.
FIXED_BY_THE_SWEEP = ("run_dir", "sweep")


class Sweep(BaseModel):
    """Runs of this job that differ in a few fields, each a run directory under ``run_dir``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    grid: dict[StrictStr, list[Scalar]] | None = Field(
        None, description="Field path -> values; the members are every combination (the cartesian product), "
        "e.g. {config.lr: [0.001, 0.003], config.seed: [0, 1]}.")
    members: list[dict[StrictStr, Scalar]] | None = Field(
        None, min_length=1, description="The members one by one, each a mapping of field path -> value, e.g. "
        "[{config.lr: 0.001}, {config.lr: 0.01, resources.nodes: 2}]. Give grid or members.")
    max_parallel: StrictInt | None = Field(
        None, ge=1, description="Most members running at once (SLURM --array=...%N; locally at most N jobs at a "
        "time, the others waiting in order); null: all at once.")

    @model_validator(mode="after")
    def _one_kind(self) -> Sweep:
        if (self.grid is None) == (self.members is None):
            raise PydanticCustomError("sweep_kind", "give exactly one of grid (values per field) and members "
                                      "(a list of mappings)")
        for key, values in (self.grid or {}).items():
            if not values:
                raise PydanticCustomError("sweep_values", "grid.{key} has no values; give a list of at least one",
                                          {"key": key})
        for key in [*(self.grid or {}), *(key for member in self.members or () for key in member)]:
            if key.split(".")[0] in FIXED_BY_THE_SWEEP:
                raise PydanticCustomError("sweep_key", "{key}: a member may not set it (its run directory is "
                                          "RUN_DIR/<member name>); remove it", {"key": key})
        return self

    def member_overrides(self) -> list[dict[str, Any]]:
        """Every member's ``{path: value}``, in order (the grid varies its last key fastest)."""
        if self.members is not None:
            return [dict(member) for member in self.members]
        combinations: list[dict[str, Any]] = [{}]
        for key, values in (self.grid or {}).items():
            combinations = [{**combination, key: value} for combination in combinations for value in values]
        return combinations
