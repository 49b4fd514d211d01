"""Every Prometheus metric of the engine process, in one registry.

Names follow cadence_engine_<what>_<unit> in base units; labels are bounded (phase, outcome)
and never carry a call id: a call id travels only as an exemplar, next to the sample a call
caused (a missed tick, an underrun), so an operator can go from a spike to the call's record.
The engine serves this registry on its own port, so exemplars survive (prometheus-client's
multiprocess mode would drop them).
"""

import sys
from collections.abc import Iterable
from types import ModuleType

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

# Buckets in seconds around the 80 ms tick, with one at exactly 0.08 (the deadline).
TICK_BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.1, 0.16)
PHASE_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16)
# Every label value known up front, so each series exists (at zero) from the first scrape.
PHASES = ("gather", "step", "scatter")
ADMISSION_OUTCOMES = ("accepted", "full", "draining", "starting")


def loaded_cuda_torch() -> ModuleType | None:
    """torch, only where the model has already imported it and CUDA is up: the echo model must
    run without torch, so this never imports it."""
    torch = sys.modules.get("torch")
    return torch if torch is not None and torch.cuda.is_available() else None


class GpuMemoryCollector(Collector):
    """torch.cuda's memory counters, read at scrape time.

    Only where `loaded_cuda_torch` finds torch: on a CPU-only engine the metrics are absent
    rather than a misleading zero.
    """

    def collect(self) -> Iterable[GaugeMetricFamily]:
        torch = loaded_cuda_torch()
        if torch is None:
            return []
        allocated = GaugeMetricFamily(
            "cadence_engine_gpu_memory_allocated_bytes",
            "GPU memory held by live tensors (torch.cuda.memory_allocated).",
            value=float(torch.cuda.memory_allocated()),
        )
        reserved = GaugeMetricFamily(
            "cadence_engine_gpu_memory_reserved_bytes",
            "GPU memory reserved by torch's caching allocator (torch.cuda.memory_reserved).",
            value=float(torch.cuda.memory_reserved()),
        )
        return [allocated, reserved]


class EngineMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.info = Info(
            "cadence_engine",
            "Model and executor this engine serves (labels model, executor).",
            registry=r,
        )
        self.ticks = Counter(
            "cadence_engine_ticks_total", "Ticks run (batched steps over all slots).", registry=r
        )
        self.deadline_misses = Counter(
            "cadence_engine_deadline_misses_total",
            "Ticks whose outputs were published after their deadline, or never run.",
            registry=r,
        )
        self.skipped_ticks = Counter(
            "cadence_engine_skipped_ticks_total",
            "Ticks never run (the engine fell behind): misses too, so the engine's miss ratio "
            "is deadline misses over ticks run plus these.",
            registry=r,
        )
        self.call_deadline_misses = Counter(
            "cadence_engine_call_deadline_misses_total",
            "Per-call frames published late or skipped, summed over calls.",
            registry=r,
        )
        self.call_ticks = Counter(
            "cadence_engine_call_ticks_total",
            "Per-call frames served, summed over calls (session-ticks).",
            registry=r,
        )
        self.call_skipped_ticks = Counter(
            "cadence_engine_call_skipped_ticks_total",
            "Per-call ticks skipped (never run: the engine fell behind), summed over calls.",
            registry=r,
        )
        self.underruns = Counter(
            "cadence_engine_underruns_total",
            "Per-call ticks with no fresh uplink frame after media started (fed silence).",
            registry=r,
        )
        self.overruns = Counter(
            "cadence_engine_uplink_overruns_total",
            "Uplink frames skipped because a newer frame was already waiting.",
            registry=r,
        )
        self.tick_duration = Histogram(
            "cadence_engine_tick_duration_seconds",
            "Time from a tick's release to its outputs being published.",
            buckets=TICK_BUCKETS,
            registry=r,
        )
        self.phase_duration = Histogram(
            "cadence_engine_phase_duration_seconds",
            "Time spent in each phase of the tick (gather, step, scatter).",
            ["phase"],
            buckets=PHASE_BUCKETS,
            registry=r,
        )
        self.slots_live = Gauge("cadence_engine_slots_live", "Slots holding a call.", registry=r)
        self.slots_capacity = Gauge(
            "cadence_engine_slots_capacity", "Slots the engine was configured with.", registry=r
        )
        self.admissions = Counter(
            "cadence_engine_admissions_total",
            "Call admission decisions by outcome (accepted, full, draining, starting).",
            ["outcome"],
            registry=r,
        )
        self.heartbeat = Gauge(
            "cadence_engine_heartbeat_seconds",
            "Monotonic time of the last completed tick.",
            registry=r,
        )
        r.register(GpuMemoryCollector())
        # each phase's child looked up once, not on every tick
        self.phases = {phase: self.phase_duration.labels(phase) for phase in PHASES}
        for outcome in ADMISSION_OUTCOMES:
            self.admissions.labels(outcome)
