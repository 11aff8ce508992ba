"""What a checkpoint holds, one named object per part: how each is saved, restored, and taken over on another world
size.

A :class:`SharedComponent` (the model, EMA, optimizer, scheduler, loss scaler, training state, progress) is saved
once, by the main process, and loaded as it is on any world size (the training state counts its place in the epoch
in the new ranks' shares). A :class:`PerRankComponent` (each rank's generators, log interval statistics, data
position) is gathered from every rank; on another world size it takes over the old ranks' states itself
(:meth:`PerRankComponent.load_resized`), or says why it cannot (:meth:`PerRankComponent.resize_problem`) and the
resume is refused naming it before anything is loaded: no component is ever dropped silently. The trainer lists
its components in one place (``Trainer.checkpoint_components``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from elfes.world_size import per_rank_data_problem

from .payload import UnusableCheckpointError
from .resize import next_batch_after_resize, rank_stream_seed, remap_log_interval, shared_generators
from .rng import seed_every_generator

if TYPE_CHECKING:
    from torch import nn

    from .config import TrainState
    from .data import TrainingData
    from .events import LogInterval


class Stateful(Protocol):
    """What a checkpoint can hold: an object with ``state_dict`` and ``load_state_dict``."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any, /) -> object: ...


@dataclass(frozen=True)
class Resize:
    """Checkpoint ``payload``, written on another world size, as rank ``rank`` of ``world`` takes it over."""

    payload: Mapping[str, Any]
    rank: int
    world: int


class SharedComponent:
    """A part saved once, by the main process, and loaded as it is on any world size (``part`` None where the run
    has none of it, e.g. no EMA)."""

    def __init__(self, name: str, part: Stateful | None) -> None:
        self.name = name
        self.part = part

    def state(self, *, on_cpu: bool) -> Any:
        """The part's state for a payload (``on_cpu``: written before training resumes, not copied later)."""
        return None if self.part is None else self.part.state_dict()

    def load(self, state: Any) -> None:
        if self.part is not None:
            self.part.load_state_dict(state)

    def load_resized(self, state: Any, resize: Resize) -> None:
        """Load ``state``, saved on another world size."""
        self.load(state)


class ModelWeights(SharedComponent):
    """The plain model's parameters and buffers."""

    def __init__(self, name: str, model: nn.Module) -> None:
        super().__init__(name, model)
        self.model = model

    def state(self, *, on_cpu: bool) -> Any:
        # A payload written before training resumes saves a tensor already on the CPU as it is: copying it first
        # would add a pass over the whole model. A snapshot copies every tensor once, later.
        return {name: tensor.detach().to("cpu") if on_cpu else tensor.detach()
                for name, tensor in self.model.state_dict().items()}


class TrainingPosition(SharedComponent):
    """The :class:`~elfes.engine.config.TrainState`; on another world size its place in the epoch is counted in
    the new ranks' shares."""

    def __init__(self, name: str, state: TrainState) -> None:
        super().__init__(name, state)
        self.position = state

    def load_resized(self, state: Any, resize: Resize) -> None:
        self.load(state)
        self.position.next_batch = next_batch_after_resize(self.position.next_batch, resize.payload["layout"], resize.world)


class PerRankComponent:
    """A part each rank saves its own of. On another world size a subclass that says how the old ranks' states are
    taken over (:meth:`load_resized`) continues; any other refuses the resume, naming it."""

    def __init__(self, name: str, part: Stateful) -> None:
        self.name = name
        self.part = part

    def state(self, *, on_cpu: bool) -> Any:
        return self.part.state_dict()

    def load(self, state: Any) -> None:
        self.part.load_state_dict(state)

    def resize_problem(self) -> str | None:
        """Why no rank of another world size can take this component over (None where it can)."""
        if type(self).load_resized is not PerRankComponent.load_resized:
            return None
        return (f"{self.name}: each rank saved its own {type(self.part).__name__} state, and this component does "
                "not say how the ranks of another world size take it over; continue on the same world size")

    def load_resized(self, states: Sequence[Any], resize: Resize) -> None:
        """Take over ``states``, every old rank's, as rank ``resize.rank`` of the new world size."""
        raise UnusableCheckpointError(f"{self.resize_problem()}.")  # check_fits refuses before anything is loaded


class Generators(PerRankComponent):
    """Each rank's generators (:class:`~elfes.engine.rng.RandomState`, every one of
    :data:`~elfes.engine.rng.GENERATORS`). On another world size each new rank starts streams derived from (data
    seed, step, rank), since the old ranks' streams have no place in the new layout, but takes a generator that
    every old rank had in the same state."""

    def load_resized(self, states: Sequence[Any], resize: Resize) -> None:
        seed_every_generator(rank_stream_seed(resize.payload, resize.rank))
        self.load(shared_generators(states))


class LogStatistics(PerRankComponent):
    """The statistics each rank gathered since the last ``train`` record; on another world size new rank 0 takes
    every old rank's (the record sums over ranks)."""

    def __init__(self, name: str, interval: LogInterval) -> None:
        super().__init__(name, interval)
        self.interval = interval

    def load_resized(self, states: Sequence[Any], resize: Resize) -> None:
        remap_log_interval(self.interval, states, resize.rank)


class DataPosition(PerRankComponent):
    """The training loader's own state (:class:`~elfes.engine.data.TrainingData`). A map-style dataset read through
    the engine's sampler keeps none per rank: its position is the run's (the training state's), so on another
    world size nothing is loaded; a loader that keeps a position per rank cannot continue there."""

    def __init__(self, name: str, data: TrainingData) -> None:
        super().__init__(name, data)
        self.data = data

    def resize_problem(self) -> str | None:
        kept = self.data.per_rank_position()
        return None if kept is None else per_rank_data_problem(kept)

    def load_resized(self, states: Sequence[Any], resize: Resize) -> None:
        """Nothing to load: the training state says where each new rank resumes its share."""


Component: TypeAlias = SharedComponent | PerRankComponent
