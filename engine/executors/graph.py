"""The graph executor: the whole device step captured once as one CUDA graph.

Warm up, allocate, capture, replay. Every buffer the step touches is allocated before the
capture at the configured slot count; per tick the host writes the uplink frames and masks
into pinned buffers, the step copies them into the graph's static inputs, replays the graph
and copies the outputs back, and the host synchronises once, at the end of the tick. Calls
join and leave through the masks; nothing is reshaped, allocated or decided on device values
inside the tick.

The step is queued ahead: `arm` (the engine calls it once a tick's outputs are published)
submits the next tick's copies in, replay and copies out behind a doorbell
(kernels/doorbell.py) on the current stream; `run` writes the inputs into the pinned
buffers, rings, runs the caller's `meanwhile` (the engine's host bookkeeping,
engine/frames.py) while the device steps, and synchronises. Submitting the graph's ~1,000
kernels at the tick instead cost ~0.4 ms at 1 call after the host slept between ticks
(bench/results/tick_idle_presubmit.json). `run` without `arm` before it submits at the tick
(tests, the warm-up). While armed, the stream is held until the ring: work queued on it
between ticks runs after the armed step (the engine's only such work is the benchmarks' age
hook, which so takes effect a step later), and a host sync on it (a pageable copy, a
synchronize) would wait for the ring forever; the engine's watchdog ends a step that never
finishes, and `close` runs an armed step out (every slot masked) when the engine stops, also
on an error. Only on x86-64 hosts (ARMS_AHEAD).

The sync: each submitted step ends with a one-program kernel that writes the step's number
into a pinned word (kernels/doorbell.py's signal_host; the copies out have landed by then).
Where `run`'s `ahead_of_outputs` ran, the step is due within its lead, and the host spins on
the word for the rest (holding the GIL that short while), looking at the step's event every
EVENT_EVERY turns, which raises a failed step's error (a failed step never writes the word);
otherwise it synchronises on the event, the GIL released. The word is seen ~30 us sooner
than the event's synchronize returns (bench/results/doorbell_trip_a7191e6.json). On the
1-call clock, alternated with the event's sync (af7cb5c) in one command, three pairs: tick
p50 6.222 / 6.201 / 6.168 ms against 6.245 / 6.234 / 6.215 (bench/results/
bench_engine_bf16_1_ab_{5425ebb,af7cb5c_vs_5425ebb}_*.json). A first form (b22ebf7, reverted
in 77bd382) spun on the word for the whole step with a sleep(0) each turn to yield the GIL,
and gained nothing: those turns cost what the word saved.

Tried and reverted (commits 1977b05, 7149936): the downlink published by the step itself, a
last launch writing each frame's int16 audio, tokens and stamp straight into the engine's
shared-memory ring registered with CUDA (cudaHostRegister), the host staging the frames'
places during the step. Right (the ring byte for byte the host scatter's, GPU test passed),
but no faster at 1 call and slower at 300: alternated in one command with 4ba5051 (host
scatter), 1 call tick p50 6.115 / 6.073 against 6.101 / 6.089 ms (the scatter phase 0.001
against 0.037, the step 15 us longer); 300 fp8 calls 48.28 against 46.70 ms, the step 47.29
against 44.86 (the scatter 0.93 ms saved, 2.4 ms added: the GPU's small stores over PCIe),
bench/results/bench_engine_{bf16_1,fp8_300}_ab_*7149936*.json.

What cannot be captured runs before the graph, on the current stream: the model's
`prepare` (host-decided work, such as replaying a prompt into the rows that start a call).
A model whose `prepare` may queue work (one with a prompt) is never armed: its step is
submitted at the tick, after that work.

`kernels_per_tick` is the number of kernel nodes in the captured graph (graph_nodes.py): what
one tick launches, reported in the engine's status and by `cadence bench engine`.
"""

import platform
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

import torch
from torch import Tensor

from engine.clock import Anticipation
from engine.executors.graph_nodes import count_kernel_nodes
from engine.models.base import Mask, Model, PcmBatch, StepOutput, check_step_inputs

WARMUP_STEPS = 3
EVENT_EVERY = 256  # the sync's spin on the done word: turns between looks at the event
# The ring relies on the host's stores reaching the bus in program order (the inputs, then
# the bell), which x86-64 guarantees; elsewhere (an Arm host: Grace) each step is submitted at
# its tick instead, until the bell's store is fenced.
ARMS_AHEAD = platform.machine() in ("x86_64", "AMD64")


@runtime_checkable
class DeviceStepModel(Model, Protocol):
    """A model whose step can also run on device tensors alone (see MoshiModel.device_step)."""

    @property
    def device(self) -> torch.device: ...

    @property
    def generator(self) -> torch.Generator | None: ...

    def prepare(self, reset: Mask) -> None: ...

    @property
    def prepare_queues_work(self) -> bool:
        """Whether `prepare` may queue device work at some tick (then no step is armed)."""

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
        # numpy views of the pinned buffers, made once: at a tick on the H200 machine's host
        # the three copies in through .numpy() took 57 us, the two output views 26
        # (bench/results/tick_host_split_77bd382.json)
        self._pcm_in = self._pcm_host.numpy()
        self._reset_in = self._reset_host.numpy()
        self._active_in = self._active_host.numpy()
        self._outputs = StepOutput(
            pcm=self._pcm_out_host.numpy(), tokens=self._tokens_out_host.numpy()
        )
        self._outputs_ahead = Anticipation()  # when run's ahead_of_outputs runs
        # each submitted step's end: its number, written into the pinned word by the GPU
        # (module docstring: the sync), then the event, which also reports a failed step
        self._finished = torch.zeros(1, dtype=torch.int64).pin_memory()
        self._finished_word = self._finished.numpy()
        self._submitted = 0
        # the armed step: the bell it waits behind (polled by the GPU), the value it waits for
        self._bell = torch.zeros(1, dtype=torch.int64).pin_memory()
        self._bell_word = self._bell.numpy()
        self._rings = 0
        self._armed = False
        self._done = torch.cuda.Event()  # type: ignore[no-untyped-call]
        self._load_signal()

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

    def arm(self) -> None:
        """Queue the next step behind the doorbell (module docstring); once per step, never
        for a model whose `prepare` may queue work."""
        if self._armed or self.model.prepare_queues_work or not ARMS_AHEAD:
            return
        # imported here: kernels/ needs triton, which CPU-only installs lack
        from kernels.doorbell import wait_for_bell

        self._rings += 1
        wait_for_bell(self._bell, self._rings)
        self._armed = True  # from here the bell must be rung, even if the submit fails
        self._submit()

    def run(
        self,
        pcm_in: PcmBatch,
        reset: Mask,
        active: Mask,
        meanwhile: Callable[[], None] | None = None,
        ahead_of_outputs: Callable[[], None] | None = None,
    ) -> StepOutput:
        """One step: the inputs into the pinned buffers, the bell rung (or the step submitted),
        `meanwhile` run while the device steps, `ahead_of_outputs` just before the step is
        expected to end (engine/clock.py's Anticipation, from the recent steps), then the
        tick's one host sync. No torch.no_grad here: nothing it runs records autograd (the
        copies and the replay are of tensors that need no gradient; a prompt's replay in
        `prepare` enters it itself). Without the two entries (this and prepare's) the 1-call
        tick's p50 on the clock was 6.073 / 6.073 ms against 6.139 / 6.161 with them,
        alternated in one command on the H200 machine (bench/results/
        bench_engine_bf16_1_ab_{039d4fb,4ba5051_vs_039d4fb}_*.json); an entry cold took 71 us
        on the development machine (MoshiModel.prepare), not measured on the H200's host."""
        check_step_inputs(self.model, pcm_in, reset, active)
        self.model.prepare(reset)  # queues nothing where a step is armed (see arm)
        self._stage_inputs(pcm_in, reset, active)
        if self._armed:
            self._ring()
        else:
            self._submit()
        began_ns = time.monotonic_ns()
        if meanwhile is not None:
            meanwhile()
        due = ahead_of_outputs is not None and self._outputs_ahead.run(
            began_ns, ahead_of_outputs, self._step_finished
        )
        self._wait_finished(due)  # the tick's one host sync
        self._outputs_ahead.waited(began_ns)
        # views of the pinned buffers: the engine consumes them before the next tick
        return self._outputs

    def rehearse(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> None:
        """The checks and the copies into the pinned buffers: an armed step reads them only
        once rung, and `run` writes them again first."""
        check_step_inputs(self.model, pcm_in, reset, active)
        self._stage_inputs(pcm_in, reset, active)

    def input_pcm(self) -> PcmBatch:
        """The pinned staging's numpy view: the engine's gather writes the uplink frames
        there, and `run` copies them no further on the host. That copy took, on the 2-core
        development machine (`python3 bench/tick_gap.py --piece stage --slots N`,
        bench/results/tick_gap_stage_{1,300}_cpu.json), 0.45 us back to back and 1-19 us
        after the idle wait at 1 call, 154 us and 230-330 us at 300 calls; not measured on
        the H200's host. An armed step reads the staging only once rung, and a step's
        outputs are in before the next tick's gather writes it again."""
        return self._pcm_in

    def _stage_inputs(self, pcm_in: PcmBatch, reset: Mask, active: Mask) -> None:
        if pcm_in is not self._pcm_in:  # else the caller filled the staging in place
            self._pcm_in[:] = pcm_in
        self._reset_in[:] = reset
        self._active_in[:] = active

    def close(self) -> None:
        """Run out an armed step with every slot masked, so no kernel is left waiting."""
        if not self._armed:
            return
        self._reset_in[:] = False
        self._active_in[:] = False
        self._ring()
        self._done.synchronize()

    def _submit(self) -> None:
        """Queue the copies in, the replay, the copies out and the step's end (the done word,
        the event) on the current stream."""
        # imported here: kernels/ needs triton, which CPU-only installs lack
        from kernels.doorbell import signal_host

        self._pcm.copy_(self._pcm_host, non_blocking=True)
        self._reset.copy_(self._reset_host, non_blocking=True)
        self._active.copy_(self._active_host, non_blocking=True)
        self.graph.replay()
        self._pcm_out_host.copy_(self._out_pcm, non_blocking=True)
        self._tokens_out_host.copy_(self._out_tokens, non_blocking=True)
        self._submitted += 1
        signal_host(self._finished, self._submitted)
        self._done.record()

    def _step_finished(self) -> bool:
        """Whether the last submitted step's outputs are in the pinned buffers (its number in
        the done word)."""
        return int(self._finished_word[0]) >= self._submitted

    def _wait_finished(self, due: bool) -> None:
        """Until the last submitted step has finished: spun on the done word when the step is
        `due` (module docstring: the sync), else the event's synchronize; a failed step
        raises from the event either way."""
        if due:
            turns = 0
            while not self._step_finished():
                turns += 1
                if turns % EVENT_EVERY == 0 and self._done.query():  # type: ignore[no-untyped-call]
                    break
        if not self._step_finished():
            self._done.synchronize()

    def _load_signal(self) -> None:
        """The done word written once now: its kernel is loaded before any step is armed
        (kernels/doorbell.py: a first launch behind an unrung bell can block the host)."""
        from kernels.doorbell import signal_host

        signal_host(self._finished, self._submitted)
        torch.cuda.synchronize()

    def _ring(self) -> None:
        # the inputs are written first, and reach the bus first (x86-64: see ARMS_AHEAD)
        self._bell_word[0] = self._rings
        self._armed = False
