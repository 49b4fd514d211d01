"""The echo model: a one-tick delay line per slot.

Each step returns the frame the slot received on the previous step, so a caller hears their
own voice one tick (80 ms) later. It has real per-slot state and honours the reset and active
masks exactly as a neural model must: the plumbing tests and the CPU default rely on it.
"""

import numpy as np

from engine.models.base import FrameSpec, Mask, PcmBatch, StepOutput, check_step_inputs

ECHO_FRAME = FrameSpec(sample_rate=24_000, samples=1920, tokens=0)


class EchoModel:
    def __init__(self, slots: int, frame: FrameSpec = ECHO_FRAME) -> None:
        self._slots = slots
        self._frame = frame
        self._previous: PcmBatch = np.zeros((slots, frame.samples), np.float32)
        self._out: PcmBatch = np.zeros((slots, frame.samples), np.float32)
        self._tokens = np.full((slots, frame.tokens), -1, np.int32)

    @property
    def name(self) -> str:
        return "echo"

    @property
    def frame(self) -> FrameSpec:
        return self._frame

    @property
    def slots(self) -> int:
        return self._slots

    def step(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> StepOutput:
        check_step_inputs(self, pcm_in, reset, active)
        self._previous[reset] = 0.0
        np.copyto(self._out, self._previous)
        self._out[~active] = 0.0
        np.copyto(self._previous, pcm_in)
        self._previous[~active] = 0.0
        return StepOutput(self._out, self._tokens)
