"""The graph executor: the whole device step captured once as one CUDA graph.

Warm up, allocate, capture, replay. Every buffer the step touches is allocated before the
capture at the configured slot count; per tick the host writes the uplink frames and masks
into pinned buffers, copies them into the graph's static inputs, replays the graph, copies the
outputs back, and synchronises once, at the end of the tick. Calls join and leave through the
masks; nothing is reshaped, allocated or decided on device values inside the tick.

What cannot be captured stays outside the graph and runs before it: the model's `prepare`
(host-decided work, such as replaying a prompt into the rows that start a call).

`kernels_per_tick` is the number of kernel nodes in the captured graph (graph_nodes.py): what
one tick launches, reported in the engine's status and by `cadence bench engine`.
"""

from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from engine.executors.graph_nodes import count_kernel_nodes
from engine.models.base import Mask, Model, PcmBatch, StepOutput, check_step_inputs

WARMUP_STEPS = 3


@runtime_checkable
class DeviceStepModel(Model, Protocol):
    """A model whose step can also run on device tensors alone (see MoshiModel.device_step)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def generator(self) -> torch.Generator | None: ...

    def prepare(self, reset: Mask) -> None: ...

    def device_step(self, pcm: Tensor, reset: Tensor, active: Tensor) -> tuple[Tensor, Tensor]: ...


class GraphExecutor:
    name = "graph"

    def __init__(self, model: DeviceStepModel) -> None:
        if model.device.type != "cuda":
            raise ValueError("the graph executor needs a CUDA device (--device cuda)")
        self.model = model
        slots, samples = model.slots, model.frame.samples
        device = model.device
        # pinned host staging: the copies in and out are asynchronous DMA
        self._pcm_host = torch.zeros(slots, samples, dtype=torch.float32).pin_memory()
        self._reset_host = torch.zeros(slots, dtype=torch.bool).pin_memory()
        self._active_host = torch.zeros(slots, dtype=torch.bool).pin_memory()
        self._pcm = torch.zeros(slots, samples, dtype=torch.float32, device=device)
        self._reset = torch.zeros(slots, dtype=torch.bool, device=device)
        self._active = torch.zeros(slots, dtype=torch.bool, device=device)
        # kept (not only instantiated) so its nodes can be counted
        self.graph = torch.cuda.CUDAGraph(keep_graph=True)
        self._out_pcm, self._out_tokens = self._capture()
        self.kernels_per_tick: int | None = count_kernel_nodes(self.graph.raw_cuda_graph())
        self.graph.instantiate()  # now, not on the first live tick
        self._pcm_out_host = torch.zeros_like(self._out_pcm, device="cpu").pin_memory()
        self._tokens_out_host = torch.zeros_like(self._out_tokens, device="cpu").pin_memory()

    def _capture(self) -> tuple[Tensor, Tensor]:
        model = self.model
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._reset.fill_(True)
            self._active.fill_(True)
            for _ in range(WARMUP_STEPS):  # lazy init, cuBLAS handles, autotuning: not captured
                model.device_step(self._pcm, self._reset, self._active)
                self._reset.fill_(False)
        torch.cuda.current_stream().wait_stream(side)
        if model.generator is not None:
            # sampling draws from the model's own generator: each replay must advance it too
            self.graph.register_generator_state(model.generator)
        with torch.cuda.graph(self.graph):
            out_pcm, out_tokens = model.device_step(self._pcm, self._reset, self._active)
        torch.cuda.synchronize()
        return out_pcm, out_tokens

    @torch.no_grad()
    def run(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> StepOutput:
        check_step_inputs(self.model, pcm_in, reset, active)
        self.model.prepare(reset)
        self._pcm_host.numpy()[:] = pcm_in
        self._reset_host.numpy()[:] = reset
        self._active_host.numpy()[:] = active
        self._pcm.copy_(self._pcm_host, non_blocking=True)
        self._reset.copy_(self._reset_host, non_blocking=True)
        self._active.copy_(self._active_host, non_blocking=True)
        self.graph.replay()
        self._pcm_out_host.copy_(self._out_pcm, non_blocking=True)
        self._tokens_out_host.copy_(self._out_tokens, non_blocking=True)
        torch.cuda.current_stream().synchronize()  # the tick's one host sync
        # views of the pinned buffers: the engine consumes them before the next tick
        return StepOutput(pcm=self._pcm_out_host.numpy(), tokens=self._tokens_out_host.numpy())
