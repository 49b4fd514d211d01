"""The graph executor's downlink published by the GPU (kernels/downlink.py): the engine's
shared-memory segment registered with CUDA, and the pinned staging through which the host
tells the step's last launch which frames go where.

Per tick: the step was queued with the publication at its end, waiting for the staged word
(GraphExecutor._submit); while the device steps, the engine stages the frames (`stage`, from
its `meanwhile`: the ring stamps of their entries zeroed, then rows, entries and stamps
written here); when `meanwhile` is over, the executor writes the step's number into the
staged word (`release`), also on a tick that staged nothing (the warm-up's steps, the run-out
at the stop, a `meanwhile` that raised), so that no queued publication waits forever.
"""

import logging

import numpy as np
import torch
from numpy.typing import NDArray
from torch import Tensor

from engine.ring import SharedRing

log = logging.getLogger(__name__)


class DeviceDownlink:
    def __init__(self, ring: SharedRing, pcm: Tensor, tokens: Tensor) -> None:
        """Register `ring`'s segment with CUDA for the step's outputs `pcm` (float32 [slots,
        samples]) and `tokens` (int32 [slots, tokens]); RuntimeError where CUDA refuses."""
        spec = ring.spec
        assert pcm.shape == (spec.slots, spec.frame_samples), (pcm.shape, spec)
        assert tokens.shape == (spec.slots, spec.tokens), (tokens.shape, spec)
        self._pcm, self._tokens = pcm, tokens
        self._base, size = ring.segment()
        error = torch.cuda.cudart().cudaHostRegister(self._base, size, 0)  # type: ignore[no-untyped-call]
        if int(error) != 0:
            raise RuntimeError(f"cudaHostRegister of the ring failed: CUDA error {int(error)}")
        self._registered = True
        # the downlink's views (kept alive by these tensors until `close`)
        self._ring: tuple[Tensor, ...] = (
            torch.from_numpy(ring.down_pcm),
            torch.from_numpy(ring.down_tokens),
            torch.from_numpy(ring.down_stamps.view(np.int64)),
        )
        slots = spec.slots
        self._staging = (
            torch.zeros(1, dtype=torch.int64).pin_memory(),  # staged: the step's number
            torch.zeros(1, dtype=torch.int64).pin_memory(),  # count
            torch.zeros(slots, dtype=torch.int64).pin_memory(),  # rows
            torch.zeros(slots, dtype=torch.int64).pin_memory(),  # ring entries
            torch.zeros(slots, dtype=torch.int64).pin_memory(),  # stamps
        )
        views = [part.numpy() for part in self._staging]
        self._staged_word, self._count, self._rows, self._cols, self._stamps = views
        self._staged_now = False
        # the kernel loaded now, before any step is armed (kernels/doorbell.py: a first
        # launch behind an unrung bell can block the host); it publishes nothing
        self.launch(0)
        torch.cuda.synchronize()

    def launch(self, value: int) -> None:
        """Queue the publication of step `value`'s frames, once its staging is released."""
        # imported here: kernels/ needs triton, which CPU-only installs lack
        from kernels.downlink import publish_frames

        pcm_ring, tokens_ring, stamps_ring = self._ring
        publish_frames(
            self._staging, value, self._pcm, self._tokens, (pcm_ring, tokens_ring, stamps_ring)
        )

    def stage(
        self,
        ring: SharedRing,
        rows: NDArray[np.intp],
        cols: NDArray[np.intp],
        stamps: NDArray[np.uint64],
    ) -> None:
        """The frames the running step publishes: slot `rows[i]` at ring entry `cols[i]`
        with `stamps[i]`; their entries' stamps are zeroed first (the ring's writer
        protocol)."""
        ring.down_stamps[rows, cols] = 0
        count = rows.size
        self._rows[:count] = rows
        self._cols[:count] = cols
        self._stamps[:count] = stamps.view(np.int64)
        self._count[0] = count
        self._staged_now = True

    def release(self, value: int) -> None:
        """Step `value`'s staging is complete (none staged: it publishes nothing)."""
        if not self._staged_now:
            self._count[0] = 0
        self._staged_now = False
        self._staged_word[0] = value  # last: x86-64 stores reach the bus in order

    def close(self) -> None:
        """Unregister the segment and drop the views into it (once no queued step can
        publish any more), so that the ring can be closed."""
        if self._registered:
            self._registered = False
            self._ring = ()
            error = torch.cuda.cudart().cudaHostUnregister(self._base)  # type: ignore[no-untyped-call]
            if int(error) != 0:
                log.warning("cudaHostUnregister of the ring failed: CUDA error %d", int(error))
