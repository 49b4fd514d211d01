"""The engine process: build the model, the ring and the control socket, then tick."""

import logging
import os
import signal
import threading
from types import FrameType

from prometheus_client import disable_created_metrics, start_http_server

from engine.config import EngineConfig
from engine.control import ControlServer
from engine.engine import Engine
from engine.executors import Executor, build_executor
from engine.metrics import EngineMetrics
from engine.models import build_model
from engine.models.base import Model
from engine.ring import EngineState, RingSpec, SharedRing
from engine.slots import SlotTable
from engine.watchdog import StepWatchdog, exit_hung

log = logging.getLogger(__name__)


class _StoppedLoading(BaseException):
    """SIGTERM or SIGINT while the model loads (a BaseException: no `except Exception` in a
    loader swallows it)."""


def run_engine(config: EngineConfig) -> int:
    disable_created_metrics()  # type: ignore[no-untyped-call]  # _created series: clutter
    stop = threading.Event()
    loading = True  # until the model and executor are built: a signal interrupts the load
    engine: Engine | None = None  # once built: a signal refuses calls from that instant

    def on_signal(signum: int, frame: FrameType | None) -> None:
        nonlocal loading
        log.info("engine got %s: stopping", signal.Signals(signum).name)
        stop.set()
        if engine is not None:
            engine.drain()
        if loading:  # nothing is created yet: end the load here (a 7B load takes minutes)
            loading = False  # a second signal only sets the event
            raise _StoppedLoading

    # before the model loads: a stop then was SIGTERM's default (no word) or a Ctrl-C traceback
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        model, executor = _load(config)
    except _StoppedLoading:
        log.info("engine stopped while loading its model, before it was ready")
        return 0
    finally:
        loading = False  # a configuration error on its way out is not interrupted either
    # from here a signal only sets `stop`: the ring and the socket go in the `finally` below,
    # and the warm-up sees the stop before its first step
    spec = RingSpec(
        slots=config.slots,
        frame_samples=model.frame.samples,
        sample_rate=model.frame.sample_rate,
        tokens=model.frame.tokens,
        depth=config.ring_depth,
        tick_period_ns=config.tick_period_ns,
    )
    ring = SharedRing.create(config.ring_name, spec)
    control: ControlServer | None = None
    watchdog: StepWatchdog | None = None
    try:
        metrics = EngineMetrics()
        if config.metrics_port:
            try:
                start_http_server(
                    config.metrics_port, config.metrics_host, registry=metrics.registry
                )
            except OSError as error:  # a port in use: one line, exit 2
                where = f"{config.metrics_host}:{config.metrics_port}"
                raise ValueError(f"cannot serve metrics on {where}: {error.strerror}") from None
        table = SlotTable(config.slots, accepting=False)
        if config.watchdog_s:
            watchdog = StepWatchdog(config.watchdog_s, lambda: exit_hung(ring.abandon))
            watchdog.start()
        engine = Engine(executor, ring, table, metrics, config.tick_period_ns, watchdog)
        hello = {
            "ring": ring.name,
            "slots": config.slots,
            "model": model.name,
            "executor": executor.name,
            "sample_rate": model.frame.sample_rate,
            "frame_samples": model.frame.samples,
            "pid": os.getpid(),
        }
        hooks = engine if config.test_hooks else None
        control = ControlServer(config.control_path, table, hello, engine.status, engine, hooks)
        control.start()
        engine.run(stop)
        engine.drain()  # a signal drained it already; a stop in the warm-up did not
    finally:
        if control is not None:
            control.stop()
        if watchdog is not None:
            watchdog.stop()  # before the ring goes: its hang action writes to the ring
        ring.set_engine_state(EngineState.STOPPED)
        ring.close()
        log.info("engine stopped; shared memory %s unlinked", config.ring_name)
    return 0


def _load(config: EngineConfig) -> tuple[Model, Executor]:
    """The model and its executor: the part of the start that a stop may interrupt."""
    model = build_model(config.model, config.slots, config.model_options)
    frame_ns = round(model.frame.samples * 1e9 / model.frame.sample_rate)
    if config.tick_period_ns != frame_ns:
        # every tick takes and gives one frame per call: any other period plays audio at the
        # wrong speed (and the gateway paces its 20 ms packets on a quarter of the tick)
        raise ValueError(
            f"--tick-ms must be the {model.name} model's frame, {frame_ns / 1e6:g} ms, "
            f"not {config.tick_period_ns / 1e6:g} ms"
        )
    return model, build_executor(config.executor, model)
