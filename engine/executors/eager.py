"""The eager executor: calls the model's step as it is, once per tick.

It is the reference the graph and persistent executors are held to: same model, same tokens.
"""

from collections.abc import Callable

import numpy as np

from engine.models.base import Mask, Model, PcmBatch, StepOutput


class EagerExecutor:
    name = "eager"
    kernels_per_tick: int | None = None  # not counted: whatever the model launches

    def __init__(self, model: Model) -> None:
        self.model = model
        self._pcm_in = np.zeros((model.slots, model.frame.samples), np.float32)

    def input_pcm(self) -> PcmBatch:
        """A plain buffer: the model's step reads what it is given."""
        return self._pcm_in

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        """The model's step; `meanwhile` runs first (the step keeps the host until it ends),
        `ahead_of_outputs` never (the outputs land when the step returns)."""
        if meanwhile is not None:
            meanwhile()
        return self.model.step(pcm_in, reset, active)

    def rehearse(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> None:
        """Nothing: the step itself starts at `run`."""

    def arm(self) -> None:
        """Nothing to get ready: each step launches at its tick."""

    def close(self) -> None:
        """Nothing is ever left queued."""
