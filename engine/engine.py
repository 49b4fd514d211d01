"""The engine: every live call advanced in lockstep, one batched step per tick.

The tick is one function, `tick`, in four phases: gather (the newest unread uplink frame of
every live slot from shared memory), step (the executor over all slots, empty ones masked;
meanwhile, while the device runs it, the host accounts for the frames gathered and stamps the
frames to publish: engine/frames.py), scatter (publish one downlink frame per live slot),
observe (time, deadline, counters). It
runs on the main thread on absolute deadlines; admission happens on the control thread and
reaches the tick only through the slot table's snapshot.
"""

import contextlib
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from engine.clock import TickClock, sleep_until
from engine.executors import Executor
from engine.frames import DownlinkScatter, Uplink, UplinkGather
from engine.metrics import PHASES, EngineMetrics, loaded_cuda_torch
from engine.models.base import AgeableModel, Mask
from engine.ring import EngineState, SharedRing, SlotState
from engine.slots import Admission, SlotTable
from engine.watchdog import WARM_UP_LIMIT_S, StepWatchdog

log = logging.getLogger(__name__)

# The host work of a tick is rehearsed before its release (Engine.wait_for_release): after the
# engine slept between ticks it ran cold, gather 0.32 ms and scatter 0.20 ms at one call on
# the H200 machine (bench/results/bench_engine_bf16_1_armed.json) against tens of us back to
# back; bench/tick_host.py measures it both ways. The rehearsal starts as long before the
# release as the longest of the last KEPT_REHEARSALS took, twice over (the last one alone let
# a slower one overrun the release: a 0.25 ms lead raised the 1-call p99 by ~0.25 ms,
# bench/results/bench_engine_bf16_1_ab_{5179f01,9a47cab_vs_5179f01}_*.json; with the longest,
# 774f48d_*.json and 9a47cab_vs_774f48d_*.json), at least REHEARSAL_NS and at most an
# eighth of the period (one stalled rehearsal must not push the lead past the idle time after
# a busy tick, where no tick would rehearse again); a tick that could not rehearse halves the
# lead. At 300 calls a fixed 1 ms was overrun (the rehearsal took ~2.5 ms) and started the
# ticks ~1.3 ms late (bench/results/bench_engine_fp8_300_rehearsed_fixed_lead.json): a
# rehearsal longer than its lead still delays the tick's start, which the tick's duration then
# shows. The closer the better: on one start of the H200 machine a piece of numpy work took
# ~20 us when run within 0.1 ms of a rehearsal, ~33 us 0.5 ms after it, ~45 us 1 ms after it
# (on another ~10, ~12 and ~18; `python3 bench/tick_gap.py`,
# bench/results/tick_gap_h200_first.json and tick_gap_h200.json), hence REHEARSAL_NS 0.25 ms
# (1 ms before). The rehearsal also runs the executor's part before its step (its checks and
# copies), and the scatter's conversion is rehearsed again just before the step's outputs land
# (`ahead_of_outputs`, engine/clock.py's Anticipation).
REHEARSAL_NS = 250_000
KEPT_REHEARSALS = 16
RECENT_TICKS = 2048  # ticks kept for the status reply's percentiles
# the per-slot control fields a new call starts from zero
CALL_COUNTERS = (
    "ticks",
    "skipped",
    "misses",
    "underruns",
    "overruns",
    "uplink_frames",
    "downlink_frames",
)


@dataclass(frozen=True)
class TickReport:
    tick: int
    live: int
    duration_s: float  # release -> outputs published
    missed: bool


class Engine:
    def __init__(
        self,
        executor: Executor,
        ring: SharedRing,
        table: SlotTable,
        metrics: EngineMetrics,
        period_ns: int,
        watchdog: StepWatchdog | None = None,
    ) -> None:
        model = executor.model
        slots, samples = model.slots, model.frame.samples
        if ring.spec.slots != slots or ring.spec.frame_samples != samples:
            raise ValueError("ring and model disagree on slots or frame size")
        self.executor = executor
        self.ring = ring
        self.table = table
        self.metrics = metrics
        self.period_ns = period_ns
        self.watchdog = watchdog  # None: a hung step blocks the engine forever
        self.clock = TickClock(0, period_ns)
        self.ticks_run = 0
        self.ticks_skipped = 0  # never run: each also a miss (ticks_missed)
        self.ticks_missed = 0
        self.recent_ticks_s: deque[float] = deque(maxlen=RECENT_TICKS)  # release -> published
        # the same ticks' gather, step and scatter (the rest of a tick: waking after release)
        self.recent_phases_s = {phase: deque[float](maxlen=RECENT_TICKS) for phase in PHASES}
        self.stall_next_tick_s = 0.0  # test hook: sleep this long inside the next tick
        self.age_next_tick = False  # test hook: age every live call's context before the step
        self._call_ids = [""] * slots  # per slot, for exemplars; written by the control thread
        self.uplink = UplinkGather(slots, samples, pcm=executor.input_pcm())
        self.downlink = DownlinkScatter(slots, samples)
        self.rehearsal_lead_ns = REHEARSAL_NS  # see REHEARSAL_NS
        self._rehearsals_ns: deque[int] = deque(maxlen=KEPT_REHEARSALS)  # what they took
        metrics.slots_capacity.set(slots)
        metrics.info.info({"model": model.name, "executor": executor.name})
        if isinstance(model, AgeableModel):
            # the age hook's kernels run once now, ageing no row: it later launches them
            # behind an armed step, where a first launch can block the host before it rings
            # (kernels/doorbell.py, CUDA's lazy loading)
            model.age_contexts(np.zeros(slots, np.bool_))

    # -- admission (control thread) ----------------------------------------------------------

    def opened(self, call_id: str, admission: Admission) -> None:
        ctrl = self.ring.control[admission.slot]
        for field in CALL_COUNTERS:  # before the generation: its readers see no old counts
            ctrl[field] = 0
        ctrl["generation"] = admission.generation
        ctrl["state"] = SlotState.LIVE
        self._call_ids[admission.slot] = call_id
        self.metrics.admissions.labels("accepted").inc()
        self.metrics.slots_live.set(self.table.live_count)
        log.info("call %s opened slot %d gen %d", call_id, admission.slot, admission.generation)

    def refused(self, call_id: str, reason: str) -> None:
        self.metrics.admissions.labels(reason).inc()
        log.info("call %s refused: %s", call_id, reason)

    def closed(self, slot: int) -> None:
        ctrl = self.ring.control[slot]
        ctrl["state"] = SlotState.FREE
        ctrl["generation"] = 0  # a stale writer sees this and stops
        self._call_ids[slot] = ""
        self.metrics.slots_live.set(self.table.live_count)

    # -- the tick (main thread) --------------------------------------------------------------

    def tick(self, tick: int) -> TickReport:
        release_ns = self.clock.release_ns(tick)
        t_start = time.perf_counter()

        # gather: what the step needs before it starts
        snap = self.table.snapshot()
        live, reset = snap.live, snap.reset
        if snap.any_reset:
            self._reset_rows(reset)
        taken = self.uplink.take(self.ring, snap)
        t_gathered = time.perf_counter()

        # step, and the host's share of gather and scatter that waits for neither (frames.py)
        # while the device runs it
        if self.age_next_tick:
            self._age_calls(live & ~reset)
        accounted: list[tuple[Uplink, NDArray[np.intp]]] = []  # the frames, the live rows

        def meanwhile() -> None:
            rows = np.flatnonzero(live)
            accounted.append((self.uplink.account(snap, taken), rows))
            self.downlink.stage(self.ring, rows, snap.generations)

        # a step that raises is over, not hung: the error ends the engine, not the watchdog
        with self._watched(f"tick {tick}"):
            out = self.executor.run(
                self.uplink.pcm, reset, live, meanwhile, self.downlink.rehearse_publish
            )
            if self.stall_next_tick_s:
                time.sleep(self.stall_next_tick_s)
                self.stall_next_tick_s = 0.0
        if not accounted:  # an executor that did not run `meanwhile` (it should, once)
            meanwhile()
        t_stepped = time.perf_counter()

        # scatter
        self.downlink.publish(self.ring, out.pcm, out.tokens)
        published_ns = time.monotonic_ns()
        t_scattered = time.perf_counter()

        # observe
        uplink, rows = accounted[0]
        missed = published_ns > self.clock.deadline_ns(tick)
        self._observe(tick, rows, uplink.underrun, uplink.skipped, missed, published_ns)
        m = self.metrics
        spans = (t_gathered - t_start, t_stepped - t_gathered, t_scattered - t_stepped)
        for phase, span in zip(PHASES, spans, strict=True):
            m.phases[phase].observe(span)
            self.recent_phases_s[phase].append(span)
        duration_s = (published_ns - release_ns) / 1e9
        self.recent_ticks_s.append(duration_s)
        m.tick_duration.observe(duration_s, self._exemplar(rows) if missed else None)
        return TickReport(tick, int(rows.size), duration_s, missed)

    def rehearse(self) -> None:
        """Run the gather and the scatter on twins of their state (engine/frames.py), and
        what the executor does before its step starts: reads the slot table and the uplink
        ring, changes nothing a call or the next tick sees."""
        snap = self.table.snapshot(consume=False)
        self.uplink.rehearse(self.ring, snap)
        self.downlink.rehearse(self.ring, np.flatnonzero(snap.live), snap.generations)
        self.executor.rehearse(self.uplink.pcm, snap.reset, snap.live)

    def wait_for_release(self, tick: int) -> None:
        """Sleep until `rehearsal_lead_ns` before the tick's release, rehearse, then spin to
        the release (a sleep could cool the caches again). A tick already that close is not
        rehearsed (its wait is sleep_until's, the last stretch spun) and halves the lead."""
        release_ns = self.clock.release_ns(tick)
        start_ns = release_ns - self.rehearsal_lead_ns
        if time.monotonic_ns() >= start_ns:
            self.rehearsal_lead_ns = max(REHEARSAL_NS, self.rehearsal_lead_ns // 2)
            sleep_until(release_ns)
            return
        sleep_until(start_ns, spin_ns=0)
        began_ns = time.monotonic_ns()
        self.rehearse()
        took_ns = time.monotonic_ns() - began_ns
        self._rehearsals_ns.append(took_ns)
        longest_ns = max(self._rehearsals_ns)
        self.rehearsal_lead_ns = min(max(REHEARSAL_NS, 2 * longest_ns), self.period_ns // 8)
        sleep_until(release_ns, spin_ns=self.period_ns)  # spun all the way

    def _reset_rows(self, reset: np.ndarray[Any, np.dtype[np.bool_]]) -> None:
        if not reset.any():
            return
        self.uplink.reset(reset)
        self.downlink.reset(reset)
        ctrl = self.ring.control
        for field in CALL_COUNTERS:
            ctrl[field][reset] = 0

    def _observe(
        self,
        tick: int,
        rows: np.ndarray[Any, np.dtype[np.intp]],
        underrun: np.ndarray[Any, np.dtype[np.bool_]],
        skipped: np.ndarray[Any, np.dtype[np.uint64]],
        missed: bool,
        published_ns: int,
    ) -> None:
        ctrl = self.ring.control
        ctrl["ticks"][rows] += 1
        ctrl["downlink_frames"][rows] += 1
        ctrl["underruns"][underrun] += 1
        ctrl["overruns"] += skipped
        ctrl["uplink_frames"][rows] = self.uplink.last[rows]
        m = self.metrics
        m.ticks.inc()
        m.call_ticks.inc(int(rows.size))
        if underrun.any():
            m.underruns.inc(int(underrun.sum()), self._exemplar(np.flatnonzero(underrun)))
        m.overruns.inc(int(skipped.sum()))
        self.ticks_run += 1
        if missed:
            self._count_misses(1, rows)
        self.ring.beat(tick, published_ns)
        m.heartbeat.set(published_ns / 1e9)

    def _skip(self, ticks: int) -> None:
        """`ticks` ticks were never run: each is a deadline, and a miss, of every live call."""
        rows = np.flatnonzero(self.table.live_mask())
        self.ticks_skipped += ticks
        self.metrics.skipped_ticks.inc(ticks)
        self.ring.control["skipped"][rows] += ticks
        self.metrics.call_skipped_ticks.inc(ticks * int(rows.size))
        self._count_misses(ticks, rows)

    def _count_misses(self, ticks: int, rows: np.ndarray[Any, np.dtype[np.intp]]) -> None:
        self.ticks_missed += ticks
        self.ring.control["misses"][rows] += ticks
        self.metrics.deadline_misses.inc(ticks)
        self.metrics.call_deadline_misses.inc(ticks * int(rows.size), self._exemplar(rows))

    def _exemplar(self, rows: np.ndarray[Any, np.dtype[np.intp]]) -> dict[str, str] | None:
        """The first affected call's id: enough to go from a spike to one call's record."""
        call_id = self._call_ids[int(rows[0])] if rows.size else ""
        return {"call_id": call_id} if call_id else None

    def drain(self) -> None:
        """Refuse new calls from now on (`draining`), the stop on its way: called from the
        signal handler, so a call admitted while the last tick runs out is not cut at once."""
        self.table.draining = True
        self.ring.set_engine_state(EngineState.DRAINING)

    def age(self) -> None:
        """Test hook (control thread): before the next step, age every live call's context to
        full (see AgeableModel; behind a step already armed, so from the step after it);
        refused for a model that cannot."""
        if not isinstance(self.executor.model, AgeableModel):
            raise ValueError(f"the {self.executor.model.name} model has no contexts to age")
        self.age_next_tick = True

    def _age_calls(self, rows: Mask) -> None:
        model = self.executor.model
        assert isinstance(model, AgeableModel)
        model.age_contexts(rows)
        self.age_next_tick = False
        log.warning("test hook: aged %d calls' contexts to full", int(rows.sum()))

    def stall(self, seconds: float) -> None:
        """Test hook (only with --test-hooks): make the next tick late by `seconds`."""
        self.stall_next_tick_s = seconds

    # -- the loop ----------------------------------------------------------------------------

    def warm_up(self, steps: int = 3, stop: threading.Event | None = None) -> bool:
        """Run a few steps over every slot before the first deadline counts; False if `stop`
        was set before they all ran.

        First calls into a model pay one-time costs (allocator, kernel selection, lazy init)
        that would otherwise land on the first real ticks. Every row is marked reset on the
        first warm-up step, and every call admitted later is reset again when it opens.
        """
        model = self.executor.model
        slots = model.slots
        silence = np.zeros((slots, model.frame.samples), np.float32)
        every = np.ones(slots, np.bool_)
        t0 = time.perf_counter()
        for i in range(steps):
            if stop is not None and stop.is_set():
                return False
            with self._watched(f"warm-up step {i}", self._warm_up_limit_s):
                self.executor.run(silence, every if i == 0 else ~every, every)
        if stop is not None and stop.is_set():
            return False
        # arming once loads what arming needs (the graph executor's doorbell kernel) now
        with self._watched("the warm-up's armed step", self._warm_up_limit_s):
            self.executor.arm()
            self.executor.close()
        log.info("warmed up in %.0f ms (%d steps)", (time.perf_counter() - t0) * 1e3, steps)
        return True

    def _watched(
        self, what: str, limit_s: float | None = None
    ) -> contextlib.AbstractContextManager[None]:
        """The block under the watchdog as one step (none: not watched)."""
        if self.watchdog is None:
            return contextlib.nullcontext()
        return self.watchdog.watching(what, limit_s)

    @property
    def _warm_up_limit_s(self) -> float:
        """WARM_UP_LIMIT_S, or the step's limit if longer."""
        step_limit_s = self.watchdog.limit_s if self.watchdog is not None else 0.0
        return max(WARM_UP_LIMIT_S, step_limit_s)

    def _close_executor(self) -> None:
        """Run out the step armed after the last tick, watched like a step."""
        with self._watched("the armed step run out at the stop"):
            self.executor.close()

    def run(self, stop: threading.Event) -> None:
        """Warm up, then tick on absolute deadlines until `stop` is set. A stop during the
        warm-up ends it there: the engine never reports ready nor admits a call."""
        if not self.warm_up(stop=stop) or stop.is_set():
            log.info("engine stopped during warm-up, before it was ready")
            return
        t0 = time.monotonic_ns() + self.period_ns
        self.clock = TickClock(t0, self.period_ns)
        self.ring.set_clock(t0)
        self.ring.set_engine_state(EngineState.READY)
        self.table.accepting = True
        log.info("engine ready: %d slots, tick %.1f ms", self.table.capacity, self.period_ns / 1e6)
        tick = -1
        try:
            while not stop.is_set():
                tick, skipped = self.clock.next_tick(tick, time.monotonic_ns())
                if skipped:
                    log.warning("engine fell behind: skipped %d ticks", skipped)
                    self._skip(skipped)
                self.wait_for_release(tick)
                report = self.tick(tick)
                self.executor.arm()  # the next step, queued while the engine waits to release it
                if report.missed:
                    ms = report.duration_s * 1e3
                    log.warning("tick %d missed its deadline (%.1f ms)", tick, ms)
        except BaseException:
            # a step armed after the last tick must not stay queued; the error is the one
            # to report, not one the device gives back while the step runs out. Logged first:
            # a run-out that hangs ends the process through the watchdog, and the error with it
            log.exception("the engine loop failed; running out the armed step")
            with contextlib.suppress(Exception):
                self._close_executor()
            raise
        self._close_executor()  # a step armed after the last tick: run out, nothing left queued

    def status(self) -> dict[str, Any]:
        ctrl = self.ring.control
        calls = []
        for info in self.table.calls():
            row = ctrl[info.slot]
            calls.append(
                {
                    "call_id": info.call_id,
                    "slot": info.slot,
                    "generation": info.generation,
                    "age_s": round(time.monotonic() - info.opened_monotonic_s, 3),
                    "ticks": int(row["ticks"]),
                    "skipped": int(row["skipped"]),
                    "misses": int(row["misses"]),
                    "underruns": int(row["underruns"]),
                    "overruns": int(row["overruns"]),
                }
            )
        return {
            "state": self.ring.engine_state().name.lower(),
            "model": self.executor.model.name,
            "executor": self.executor.name,
            "slots": self.table.capacity,
            "live": len(calls),
            "ticks": self.ticks_run,
            "skipped": self.ticks_skipped,  # misses <= ticks + skipped
            "misses": self.ticks_missed,
            "recent_tick_ms": _tick_percentiles(self.recent_ticks_s),
            "recent_phase_ms": {
                phase: _tick_percentiles(spans) for phase, spans in self.recent_phases_s.items()
            },
            "busy_share": _busy_share(self.recent_ticks_s, self.period_ns),
            "rehearsal_lead_ms": round(self.rehearsal_lead_ns / 1e6, 3),
            "kernels_per_tick": self.executor.kernels_per_tick,
            "gpu_memory_gb": _gpu_memory_gb(),
            "calls": calls,
        }


def _busy_share(durations_s: deque[float], period_ns: int) -> float | None:
    """Mean share of the tick period spent from release to outputs published (recent ticks):
    how busy the step keeps the device, host copies and the one sync included."""
    if not durations_s:
        return None
    return round(sum(durations_s) / len(durations_s) / (period_ns / 1e9), 4)


def _gpu_memory_gb() -> dict[str, float] | None:
    """torch.cuda's allocated and peak memory, only where the model already loaded torch."""
    torch = loaded_cuda_torch()
    if torch is None:
        return None
    return {
        "allocated": round(torch.cuda.memory_allocated() / 1e9, 2),
        "peak": round(torch.cuda.max_memory_allocated() / 1e9, 2),
    }


def _tick_percentiles(durations_s: deque[float]) -> dict[str, float] | None:
    """p50 / p99 / max of the last RECENT_TICKS ticks, in milliseconds."""
    if not durations_s:
        return None
    ms = np.sort(np.fromiter(durations_s, float)) * 1e3
    return {
        "count": int(ms.size),
        "p50": round(float(ms[ms.size // 2]), 3),
        "p99": round(float(ms[min(ms.size - 1, int(0.99 * ms.size))]), 3),
        "max": round(float(ms[-1]), 3),
    }
