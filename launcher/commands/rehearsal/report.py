"""What ``elfes rehearse`` reports: each interruption as it happened, which kinds landed, the verdict
and its line (``exact (requeue, stop, kill: 3 of 3 landed)``), the notes, and ``report.json``. Torch-free.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .compare import RESIZE_TOLERANCE, Comparison, Resized

VERDICTS = ("exact", "within rounding", "not resumable", "not reproducible")


def decide_verdict(straight: Comparison, resumed: Comparison | None, resized: Resized | None) -> str:
    """One of :data:`VERDICTS`: "not reproducible" where the straight runs differ; after a resize "within rounding"
    or "not resumable" from ``resized`` alone (its sums are reduced in another order, so it is never judged
    exact); else "exact" where the interrupted run (``resumed``) equals straight-1, "not resumable" where not."""
    if not straight.identical:
        return "not reproducible"
    if resized is not None:
        return "within rounding" if resized.within_rounding else "not resumable"
    return "exact" if resumed is not None and resumed.identical else "not resumable"


@dataclass
class Interruption:
    """One interruption as it happened: what was sent, at which step, and what the run saved."""

    kind: str
    planned_step: int
    step: int | None  # the latest step the run had reached when it was interrupted
    moment: str  # e.g. "0.42 of an update after step 7", "during the checkpoint write of step 8"
    attempt: int | None  # the attempt it ended
    saved_step: int | None = None  # the step the next attempt continues from, where known
    landed: bool = True  # False when the run had finished, or saved its last update: nothing was resumed

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def after_the_last_update(interruptions: list[Interruption], final_step: int | None) -> list[Interruption]:
    """Mark as not landed each interruption whose attempt saved the run's final step (its signal arrived in
    the last update): the relaunch had nothing left to train, so it proves nothing about resume."""
    late = [i for i in interruptions if i.landed and final_step is not None and i.saved_step is not None
            and i.saved_step >= final_step]
    for interruption in late:
        interruption.landed = False
    return late


def landed_per_kind(kinds: tuple[str, ...], requested: list[str], interruptions: list[Interruption]) -> dict[str, int]:
    """How many interruptions of each requested kind landed mid-run."""
    return {kind: sum(1 for i in interruptions if i.kind == kind and i.landed) for kind in kinds if kind in requested}


def verdict_line(verdict: str, requested: list[str], landed: dict[str, int]) -> str:
    """``exact (requeue, stop, kill: 3 of 3 landed)``, the kinds in the order of ``landed`` (see
    :func:`landed_per_kind`); a kind that never landed is named."""
    kinds = list(landed) + [kind for kind in dict.fromkeys(requested) if kind not in landed]
    total = sum(landed.values())
    exercised = [kind for kind in kinds if landed.get(kind)]
    line = f"{verdict} ({', '.join(exercised) or 'nothing'}: {total} of {len(requested)} landed"
    missing = [kind for kind in kinds if not landed.get(kind)]
    if missing:
        line += f"; {', '.join(missing)} never landed mid-run, so {'it is' if len(missing) == 1 else 'they are'} untested"
    return line + ")"


@dataclass
class Report:
    verdict: str
    spec: str
    rehearsal_dir: str
    seed: int
    executor: str
    interruptions: list[Interruption]
    straight: Comparison
    interrupted: Comparison | None  # None when the straight runs differ (the interrupted run is skipped)
    requested: list[str] = field(default_factory=list)  # the kinds of the plan, one per interruption
    kinds: tuple[str, ...] = ()
    retried: list[dict[str, Any]] = field(default_factory=list)  # earlier passes' interruptions that missed
    notes: list[str] = field(default_factory=list)
    likely_causes: list[str] = field(default_factory=list)
    advice: list[str] = field(default_factory=list)
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    resized: Resized | None = None  # --resize: how the continuation on another world size compares

    @property
    def differences(self) -> Comparison:
        """The comparison the verdict rests on."""
        return self.interrupted if self.verdict != "not reproducible" and self.interrupted else self.straight

    @property
    def landed(self) -> dict[str, int]:
        return landed_per_kind(self.kinds, self.requested, self.interruptions)

    @property
    def summary(self) -> str:
        if self.verdict == "not reproducible":
            return f"{self.verdict} (the straight runs differ; no interruption was tried)"
        if self.resized is not None:
            return resized_line(self.verdict, self.resized)
        return verdict_line(self.verdict, self.requested, self.landed)

    def to_json(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict, "summary": self.summary, "spec": self.spec, "rehearsal_dir": self.rehearsal_dir,
            "seed": self.seed, "executor": self.executor, "interruptions": [i.to_json() for i in self.interruptions],
            "landed": self.landed, "requested": {kind: self.requested.count(kind) for kind in self.kinds
                                                 if kind in self.requested},
            "retried": self.retried,
            "differences": {**self.differences.to_json(),
                            "compared": ("straight-2 vs straight-1" if self.verdict == "not reproducible"
                                         else "interrupted vs straight-1")},
            "straight_vs_straight": self.straight.to_json(),
            "interrupted_vs_straight": self.interrupted.to_json() if self.interrupted else None,
            "notes": self.notes, "likely_causes": self.likely_causes, "advice": self.advice, "runs": self.runs,
            "resized": self.resized.to_json() if self.resized is not None else None,
        }


def resized_line(verdict: str, resized: Resized) -> str:
    """The verdict of a pause continued on another world size: whether every update counted the same samples
    (exact), whether the losses stayed within rounding, and the largest relative difference of any tensor."""
    after = f"after step {resized.resumed_at}" if resized.resumed_at is not None else "after the pause"
    samples = (f"the same samples in every update {after}" if resized.samples_identical else
               f"other samples from step {resized.samples_differ_at} (another sample count)")
    losses = (f"the losses within {RESIZE_TOLERANCE:g} (relative, at most {resized.largest_loss_difference:.1e})"
              if resized.losses_within_tolerance else
              f"the losses differ by up to {resized.largest_loss_difference:.1e} (relative), more than rounding")
    data = f"{samples}, {losses}"
    largest = (f"the largest relative difference of any tensor {resized.largest_difference:.1e}"
               + (f", in {resized.largest_in}" if resized.largest_in else ""))
    unmatched = (f"; {len(resized.unmatched)} entries no rounding explains, e.g. "
                 f"{resized.unmatched[0].file} {resized.unmatched[0].name}: {resized.unmatched[0].note}"
                 if resized.unmatched else "")
    ranks = f"{resized.ranks} rank{'' if resized.ranks == 1 else 's'}"
    return f"{verdict} on {ranks} ({data}; {largest}{unmatched})"
