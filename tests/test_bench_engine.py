"""`cadence bench engine` end to end on the echo model: real engine processes, real clock."""

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.control import ControlError, ask_once
from tests.support.server import children_of


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
    assert result["complete"] is True
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", result["machine"]["cadence_commit"])
    assert shlex.split(result["command"])[-1] == f"--json={out}"
    for run in result["runs"]:
        assert run["model"] == "echo"
        assert run["executor"] == "eager"
        assert run["zero_misses"]
        assert run["deadline_misses"] == 0
        assert run["unaccounted_ticks"] == 0
        # ~25 ticks in 2 s for each call; the first tick may start before every open lands
        assert run["session_ticks"] >= run["calls"] * 20
        assert 0 < run["busy_share"] < 0.5  # echo copies frames: far under the period
        ticks = run["tick_ms_recent"]
        for phase in ("gather", "step", "scatter"):
            spans = run["phase_ms_recent"][phase]
            assert spans["count"] == ticks["count"], (phase, spans, ticks)
            assert 0 < spans["p50"] <= ticks["max"], (phase, spans, ticks)
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


@pytest.mark.parametrize("flag", ["--seconds=0", "--seconds=-5", "--json=/proc/nope/x.json"])
def test_a_run_that_could_not_report_is_refused_up_front(flag: str) -> None:
    done = bench("--slots=1", flag, timeout_s=60)
    assert done.returncode == 2, done.stdout
    assert "Traceback" not in done.stderr
    assert done.stdout == "", "no result: no run was made"


def _start_bench(*flags: str) -> "subprocess.Popen[str]":
    """`cadence bench engine --model=echo FLAGS` in the background, its output piped."""
    command = [sys.executable, "-m", "cadence", "bench", "engine", "--model=echo", *flags]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _shm_segments(pid: int) -> list[str]:
    return [name for name in os.listdir("/dev/shm") if name.startswith(f"cadence-bench-{pid}-")]


def test_sigterm_mid_run_stops_the_engine_and_reports_what_ran(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    bench = _start_bench("--sweep=1,2", "--seconds=3", f"--json={out}")
    deadline = time.monotonic() + 60
    while not out.exists():  # the first run (1 call) is reported: the second one is running
        assert time.monotonic() < deadline, "the first run never finished"
        time.sleep(0.1)
    assert json.loads(out.read_text())["complete"] is False, "a killed sweep's file says so"
    time.sleep(1.0)
    engines = children_of(bench.pid)
    assert engines, "the second run's engine is up"
    bench.send_signal(signal.SIGTERM)
    stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 130, stderr
    assert "Traceback" not in stderr
    result = json.loads(stdout)
    assert (result["interrupted"], result["complete"]) == (True, False)
    assert [run["calls"] for run in result["runs"]] == [1]
    assert json.loads(out.read_text()) == result
    assert _shm_segments(bench.pid) == []
    assert not [pid for pid in engines if Path(f"/proc/{pid}").exists()], "engine left running"


def _engines_of(pid: int) -> list[int]:
    """The bench's engine processes: its children running `cadence engine` (not, say, the
    `uname -p` that platform.platform() runs while the bench describes its machine)."""
    found = []
    for child in children_of(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue  # it has exited
        if b"engine" in argv and b"cadence" in argv:
            found.append(child)
    return found


def _calls_open(control: Path) -> int:
    try:
        return len(ask_once(control, {"op": "status"}, timeout_s=1.0)["calls"])
    except (ControlError, OSError):
        return 0  # not listening yet


def test_an_engine_that_dies_mid_run_is_an_error_in_the_result() -> None:
    bench = _start_bench("--slots=1", "--seconds=30")
    deadline = time.monotonic() + 60
    while not (engines := _engines_of(bench.pid)):
        assert time.monotonic() < deadline, "no engine started"
        time.sleep(0.1)
    time.sleep(2.0)  # calls open, ticking
    os.kill(engines[0], signal.SIGKILL)
    stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 1, stderr
    assert "Traceback" not in stderr
    (run,) = json.loads(stdout)["runs"]
    assert run["error"] == "engine exited (status -9)"
    assert _shm_segments(bench.pid) == []


def test_a_tick_still_running_when_the_window_closes_is_no_pass(tmp_path: Path) -> None:
    """A tick stalled (the engine's `stall` test hook) across the end of the window: when the
    counters are read it is neither run nor skipped, and its miss is counted after. Such a
    run used to pass; its file, left by a killed sweep, looked finished."""
    out = tmp_path / "bench.json"
    # tiny Moshi on the CPU: --full-context needs a model with contexts, and starts the
    # engine with --test-hooks, which `stall` needs
    model = ("--model=moshi", "--random-weights", "--config=tiny", "--full-context")
    bench = _start_bench(*model, "--slots=1", "--seconds=3", f"--json={out}")
    deadline = time.monotonic() + 120
    while not (engines := _engines_of(bench.pid)):
        assert time.monotonic() < deadline, "no engine started"
        time.sleep(0.1)
    argv = Path(f"/proc/{engines[0]}/cmdline").read_bytes().decode().split("\0")
    control = Path(next(a for a in argv if a.startswith("--control=")).split("=", 1)[1])
    while not _calls_open(control):  # the window opens half a second after the call does
        assert time.monotonic() < deadline, "no call opened"
        time.sleep(0.05)
    time.sleep(2.0)
    # the next tick sleeps 4 s: past the window's end (3 s after it opened)
    assert ask_once(control, {"op": "stall", "seconds": 4.0}) == {"ok": True}
    stdout, stderr = bench.communicate(timeout=60)
    assert bench.returncode == 3, stderr
    (run,) = json.loads(stdout)["runs"]
    assert run["deadline_misses"] == 0, "the stalled tick's miss comes after the read"
    assert run["unaccounted_ticks"] > 0, run
    assert not run["zero_misses"], run
    assert json.loads(out.read_text())["complete"] is True
