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
from engine.executors import build_executor
from engine.metrics import EngineMetrics
from engine.models import build_model
from engine.ring import EngineState, RingSpec, SharedRing
from engine.slots import SlotTable
from engine.watchdog import StepWatchdog, exit_hung

log = logging.getLogger(__name__)


def run_engine(config: EngineConfig) -> int:
    disable_created_metrics()  # type: ignore[no-untyped-call]  # _created series: clutter
    model = build_model(config.model, config.slots, config.model_options)
    frame_ns = round(model.frame.samples * 1e9 / model.frame.sample_rate)
    if config.tick_period_ns != frame_ns:
        # every tick takes and gives one frame per call: any other period plays audio at the
        # wrong speed (and the gateway paces its 20 ms packets on a quarter of the tick)
        raise ValueError(
            f"--tick-ms must be the {model.name} model's frame, {frame_ns / 1e6:g} ms, "
            f"not {config.tick_period_ns / 1e6:g} ms"
        )
    executor = build_executor(config.executor, model)
    spec = RingSpec(
        slots=config.slots,
        frame_samples=model.frame.samples,
        sample_rate=model.frame.sample_rate,
        tokens=model.frame.tokens,
        depth=config.ring_depth,
        tick_period_ns=config.tick_period_ns,
    )
    ring = SharedRing.create(config.ring_name, spec)
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("engine got %s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
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
        ring.set_engine_state(EngineState.DRAINING)
        table.draining = True
    finally:
        if control is not None:
            control.stop()
        if watchdog is not None:
            watchdog.stop()  # before the ring goes: its hang action writes to the ring
        ring.set_engine_state(EngineState.STOPPED)
        ring.close()
        log.info("engine stopped; shared memory %s unlinked", config.ring_name)
    return 0
