"""The engine process's one typed configuration, validated when built."""

from dataclasses import dataclass, field
from pathlib import Path

from engine.executors import EXECUTORS
from engine.models import MODELS, ModelOptions


@dataclass(frozen=True)
class EngineConfig:
    control_path: Path  # Unix socket for admission (open/close/status)
    ring_name: str  # shared-memory segment name
    slots: int = 32
    model: str = "echo"
    executor: str = "eager"
    tick_period_s: float = 0.08
    ring_depth: int = 4  # frames per ring and direction
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 9101  # 0: no metrics endpoint
    test_hooks: bool = False  # accept test-only control ops (an induced stall)
    watchdog_s: float = 10.0  # a step running longer is hung: the engine exits (0: never)
    model_options: ModelOptions = field(default_factory=ModelOptions)

    def __post_init__(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"unknown model {self.model!r}; choose one of {', '.join(MODELS)}")
        self.model_options.check(self.model)
        if self.executor not in EXECUTORS:
            raise ValueError(
                f"unknown executor {self.executor!r}; choose one of {', '.join(EXECUTORS)}"
            )
        if not 1 <= self.slots <= 4096:
            raise ValueError(f"slots must be in 1..4096, got {self.slots}")
        if not 0.005 <= self.tick_period_s <= 1.0:
            raise ValueError(f"tick period must be in 5 ms..1 s, got {self.tick_period_s}")
        if not 2 <= self.ring_depth <= 64:
            raise ValueError(f"ring depth must be in 2..64, got {self.ring_depth}")
        if not 0 <= self.watchdog_s <= 3600:
            raise ValueError(f"--watchdog-s must be in 0..3600 (0: off), got {self.watchdog_s}")
        if not 0 <= self.metrics_port <= 65535:
            raise ValueError(f"invalid metrics port {self.metrics_port}")
        if not self.ring_name or "/" in self.ring_name:
            raise ValueError(f"invalid shared-memory name {self.ring_name!r}")

    @property
    def tick_period_ns(self) -> int:
        return round(self.tick_period_s * 1e9)
