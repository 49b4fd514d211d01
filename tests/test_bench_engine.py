"""`cadence bench engine` end to end on the echo model: real engine processes, real clock."""

import json
import subprocess
import sys
from pathlib import Path


def bench(*flags: str, timeout_s: float = 120) -> "subprocess.CompletedProcess[str]":
    """`cadence bench engine --model=echo FLAGS` (no metrics port, warnings only)."""
    return subprocess.run(
        [
            sys.executable,
            *("-m", "cadence", "bench", "engine", "--model=echo", "--metrics-port=0"),
            "--log-level=warning",
            *flags,
        ],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_sweep_holds_each_call_count_and_reports_the_largest(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = bench("--sweep=3,1", "--seconds=2", f"--json={out}")
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert json.loads(done.stdout) == result
    assert [run["calls"] for run in result["runs"]] == [1, 3]  # ascending
    assert result["largest_zero_miss_calls"] == 3
    for run in result["runs"]:
        assert run["model"] == "echo"
        assert run["executor"] == "eager"
        assert run["zero_misses"]
        assert run["deadline_misses"] == 0
        # ~25 ticks in 2 s for each call; the first tick may start before every open lands
        assert run["session_ticks"] >= run["calls"] * 20
        assert 0 < run["busy_share"] < 0.5  # echo copies frames: far under the period
        assert run["kernels_per_tick"] is None  # eager: nothing captured to count
        assert run["gpu_memory_gb"] is None  # the echo engine never loads torch


def test_bad_sweep_is_one_clear_error() -> None:
    done = bench("--sweep=0,5", timeout_s=60)
    assert done.returncode == 2
    assert "--sweep" in done.stderr
    assert "Traceback" not in done.stderr


def test_full_context_on_a_model_without_contexts_is_an_error_not_a_result(
    tmp_path: Path,
) -> None:
    out = tmp_path / "bench.json"
    done = bench("--slots=1", "--seconds=1", "--full-context", f"--json={out}", timeout_s=60)
    assert done.returncode == 1, done.stderr
    (run,) = json.loads(out.read_text())["runs"]
    assert "age refused" in run["error"]
