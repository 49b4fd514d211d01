"""The contract between the engine and a model: one batched step over all slots per tick.

A model owns the per-slot state of every call (allocated once, for `slots` rows) and
advances all of it in one `step`. Calls join and leave by mask, never by reshaping:

    pcm_in:  float32 [slots, frame.samples]   uplink audio in [-1, 1], one frame per slot
    reset:   bool    [slots]                  row starts a new call this tick: clear its state
                                              before using pcm_in (a reused slot must never
                                              carry the previous caller's state)
    active:  bool    [slots]                  row holds a live call; inactive rows are computed
                                              or skipped as the model likes, and their outputs
                                              are ignored
    ->
    StepOutput.pcm:    float32 [slots, frame.samples]  downlink audio
    StepOutput.tokens: int32   [slots, frame.tokens]   what the step emitted besides audio
                                                       (Moshi: text token + audio codes);
                                                       -1 where nothing was emitted

Arrays at this boundary are numpy on the host: the engine's shared-memory ring is numpy, and
executors that keep device buffers copy at their own edge.
"""

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
from numpy.typing import NDArray

PcmBatch = NDArray[np.float32]
Mask = NDArray[np.bool_]
TokenBatch = NDArray[np.int32]


@dataclass(frozen=True)
class FrameSpec:
    """What one step consumes and produces per slot."""

    sample_rate: int  # Hz
    samples: int  # per frame; Moshi: 1920 at 24 kHz = 80 ms
    tokens: int  # int32 tokens emitted per step besides audio (0 for echo)

    def __post_init__(self) -> None:
        if self.sample_rate <= 0 or self.samples <= 0 or self.tokens < 0:
            raise ValueError(f"invalid frame spec {self}")

    @property
    def duration_s(self) -> float:
        return self.samples / self.sample_rate


@dataclass(frozen=True)
class StepOutput:
    pcm: PcmBatch  # float32 [slots, samples]
    tokens: TokenBatch  # int32 [slots, tokens]


class Model(Protocol):
    """A batched streaming model; see the module docstring for shapes and masks."""

    @property
    def name(self) -> str: ...

    @property
    def frame(self) -> FrameSpec: ...

    @property
    def slots(self) -> int: ...

    def step(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> StepOutput: ...


@runtime_checkable
class AgeableModel(Model, Protocol):
    """A model whose calls can be aged, for benchmarks only (`cadence bench engine
    --full-context`): `age_contexts(rows)` makes those rows' attention contexts count as full,
    as if each call had run for the whole context, so a short run costs per tick what a call
    two minutes in does. Only positions move; the contents of the contexts are whatever they
    hold."""

    def age_contexts(self, rows: Mask) -> None: ...


def check_step_inputs(model: Model, pcm_in: PcmBatch, reset: Mask, active: Mask) -> None:
    """Assert the boundary shapes and dtypes; models call this at the top of `step`."""
    expected = (model.slots, model.frame.samples)
    if pcm_in.shape != expected or pcm_in.dtype != np.float32:
        raise ValueError(f"pcm_in must be float32 {expected}, got {pcm_in.dtype} {pcm_in.shape}")
    for name, mask in (("reset", reset), ("active", active)):
        if mask.shape != (model.slots,) or mask.dtype != np.bool_:
            raise ValueError(f"{name} must be bool ({model.slots},), got {mask.dtype} {mask.shape}")
