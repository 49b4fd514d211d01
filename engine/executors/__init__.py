"""Executors run a model's step each tick; all of them must give the same tokens."""

from collections.abc import Callable
from typing import Protocol

from engine.models.base import Mask, Model, PcmBatch, StepOutput


class Executor(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def model(self) -> Model: ...

    @property
    def kernels_per_tick(self) -> int | None:
        """Kernels one tick launches, where the executor knows (a captured graph's nodes)."""

    def input_pcm(self) -> PcmBatch:
        """A buffer for a step's uplink audio, float32 [slots, samples], that the caller may
        fill in place and pass to `run`, which then copies none of it (the graph executor's
        pinned staging); the same buffer at every call."""

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        """One step. `meanwhile`, host work that needs neither the step's inputs after they
        are handed over nor its outputs, runs once during the step: while the device runs it,
        where the executor can. `ahead_of_outputs`, work that changes nothing (a rehearsal of
        what the caller does with the outputs), runs just before they land where the executor
        can tell when that is, else not at all."""

    def rehearse(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> None:
        """What `run` does before its step starts (the inputs' checks and copies), changing
        nothing a step sees: the engine's rehearsal before a release."""

    def arm(self) -> None:
        """Between ticks, once the last one's outputs are published: get the next step
        ready where the executor can (the graph executor queues it behind a doorbell)."""

    def close(self) -> None:
        """When the engine stops: leave nothing queued on the device."""


EXECUTORS = ("eager", "graph")


def build_executor(name: str, model: Model) -> Executor:
    from engine.executors.eager import EagerExecutor

    if name == "eager":
        return EagerExecutor(model)
    if name == "graph":
        from engine.executors.graph import DeviceStepModel, GraphExecutor

        if not isinstance(model, DeviceStepModel):
            raise ValueError(f"the {model.name} model has no device step to capture; use eager")
        return GraphExecutor(model)
    raise ValueError(f"unknown executor {name!r}; choose one of {', '.join(EXECUTORS)}")
