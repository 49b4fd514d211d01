"""Both processes' registries against the observability contract (docs/observability.md).

Names cadence_<part>_<what>_<unit> in base units, counters ending in _total, help text on
every metric, bounded labels only and never a call id, a bucket at exactly 0.08 s in every
latency histogram. The GPU gauges appear only when the model has loaded torch with CUDA.
"""

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from engine.metrics import EngineMetrics, GpuMemoryCollector
from gateway.metrics import GatewayMetrics

BOUNDED_LABELS = {"transport", "codec", "direction", "reason", "outcome", "phase"}
INFO_LABELS = {"model", "executor"}  # one series per engine: what it serves
NON_BASE_UNIT = re.compile(
    r"_(ms|us|ns|milliseconds|microseconds|nanoseconds|minutes|hours|"
    r"kb|mb|gb|kib|mib|gib|kilobytes|megabytes|percent)(_|$)"
)
LOOKS_LIKE_A_CALL = re.compile(r"call|(^|_)id$|uuid|session")


def families() -> Iterator[tuple[str, Metric]]:
    registries: dict[str, CollectorRegistry] = {
        "engine": EngineMetrics().registry,
        "gateway": GatewayMetrics().registry,
    }
    for part, registry in registries.items():
        for family in registry.collect():
            yield part, family


def test_every_metric_has_help_and_a_name_in_its_parts_namespace() -> None:
    seen = 0
    for part, family in families():
        seen += 1
        assert len(family.documentation) > 15, f"{family.name} needs real help text"
        for sample in family.samples:
            assert re.fullmatch(rf"cadence_{part}_[a-z][a-z0-9_]*", sample.name), sample.name
            assert not NON_BASE_UNIT.search(sample.name), f"{sample.name}: not a base unit"
    assert seen >= 20, "both registries are read"


def test_counters_end_in_total_and_histograms_in_a_base_unit() -> None:
    for _, family in families():
        names = {s.name for s in family.samples if not s.name.endswith("_created")}
        if family.type == "counter":
            assert names, family.name
            assert all(n.endswith("_total") for n in names), family.name
        elif family.type == "histogram":
            assert family.name.endswith(("_seconds", "_bytes")), family.name
        else:
            assert not any(n.endswith("_total") for n in names), f"{family.name}: not a counter"


def test_labels_are_bounded_and_never_a_call_id() -> None:
    for _, family in families():
        labels = {key for s in family.samples for key in s.labels} - {"le"}
        allowed = INFO_LABELS if family.type == "info" else BOUNDED_LABELS
        assert labels <= allowed, f"{family.name} has unbounded labels {labels - allowed}"
        assert not any(LOOKS_LIKE_A_CALL.search(label) for label in labels), family.name


def test_latency_histograms_have_a_bucket_at_the_80_ms_deadline() -> None:
    histograms = 0
    for _, family in families():
        if family.type != "histogram" or not family.name.endswith("_seconds"):
            continue
        histograms += 1
        bounds = {s.labels["le"] for s in family.samples if s.name.endswith("_bucket")}
        assert "0.08" in bounds, f"{family.name} buckets {sorted(bounds)}"
    assert histograms >= 6


def test_the_echo_engine_never_imports_torch_and_shows_no_gpu_memory() -> None:
    script = (
        "import sys\n"
        "from prometheus_client import generate_latest\n"
        "from engine.executors import build_executor\n"
        "from engine.metrics import EngineMetrics\n"
        "from engine.models import build_model\n"
        "build_executor('eager', build_model('echo', 2))\n"
        "text = generate_latest(EngineMetrics().registry).decode()\n"
        "assert 'torch' not in sys.modules, 'the echo engine imported torch'\n"
        "assert 'gpu_memory' not in text, 'GPU gauges without CUDA'\n"
        "assert 'cadence_engine_ticks_total' in text\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_gpu_memory_follows_torch_cuda_when_torch_is_loaded() -> None:
    torch = pytest.importorskip("torch")
    names = {f.name for f in GpuMemoryCollector().collect()}
    if not torch.cuda.is_available():
        assert names == set(), "no CUDA: the gauges are absent, not zero"
        return
    block = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    values = {f.name: f.samples[0].value for f in GpuMemoryCollector().collect()}
    assert values["cadence_engine_gpu_memory_allocated_bytes"] >= block.numel()
    assert (
        values["cadence_engine_gpu_memory_reserved_bytes"]
        >= values["cadence_engine_gpu_memory_allocated_bytes"]
    )
