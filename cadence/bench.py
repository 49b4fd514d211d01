"""`cadence bench engine`: hold N calls on a real engine, on the real 80 ms clock, and count.

It starts an engine process exactly as `cadence engine` would, opens N calls through the
admission socket (the slots are live; their uplink is silence, which costs the model what
speech costs), lets the engine tick for the given time, and reads back the per-call counters:
session-ticks served, deadline misses, tick time (release to outputs published) percentiles,
the busy share of the 80 ms period, the kernels one tick launches (the captured graph's kernel
nodes) and GPU memory. The verdict is zero misses, every period of the window a tick run
or skipped (`unaccounted_ticks` 0: a tick still running as the counters are read is no
pass), or not; nothing is extrapolated. `--sweep`
runs one engine per call count, ascending, and reports the largest count with zero misses.
Attention skips the ring entries a young call has not written, so only a run longer than the KV
context (2 minutes by default) measures the worst case, every ring full: the default is 130 s.
`--full-context` gets there at once: the engine (started with --test-hooks) ages every call's
contexts to full (AgeableModel) AGE_AFTER_S after the last call opened, so a 40 s run costs per
tick what calls two minutes in do; the ring contents are then whatever the slots hold, which
changes no cost. The counters include the few ticks before the aging (about 6 per call), and
tick percentiles cover the last 2048 ticks (engine.RECENT_TICKS): the whole of a 40 s run.

Results are written as JSON with the machine, versions and the command.
"""

import argparse
import json
import logging
import os
import platform
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from cadence.supervise import die_with_parent, stop_child, wait_ready
from engine.control import ask
from engine.infer import check_writable
from engine.ring import unlink_segment

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0
STOP_TIMEOUT_S = 30.0  # a large model's engine may take a while to free the GPU
UNACCOUNTED_SLACK = 2  # periods: the tick in flight as the window opens and as it closes
AGE_AFTER_S = 0.5  # after the last open, before aging: several ticks, so every call has reset
INTERRUPTED = 130  # Ctrl-C or SIGTERM: the runs so far are reported, marked interrupted


def versions(device: str = "cuda") -> dict[str, str]:
    """The machine a benchmark ran on: Python, platform, Cadence's commit when it runs from a
    checkout, and torch and the GPU (`device`'s) where present."""
    found = {"python": platform.python_version(), "platform": platform.platform()}
    commit = _commit()
    if commit is not None:
        found["cadence_commit"] = commit
    try:
        import torch

        found["torch"] = torch.__version__
        if torch.cuda.is_available():
            cuda = torch.device(device if device.startswith("cuda") else "cuda")
            found["gpu"] = torch.cuda.get_device_name(cuda)
            found["cuda"] = str(torch.version.cuda)
    except ImportError:
        pass
    return found


def _commit() -> str | None:
    """The checkout's commit, "+dirty" with uncommitted changes; None outside a checkout."""
    here = Path(__file__).resolve().parent.parent
    # tags excluded: the bare 40-digit commit, whatever the history is tagged
    describe = ["describe", "--always", "--abbrev=40", "--dirty=+dirty", "--exclude=*"]
    try:
        found = subprocess.run(
            ["git", "-C", str(here), *describe], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return found.stdout.strip() if found.returncode == 0 else None


def bench_engine(args: argparse.Namespace, engine_argv: Callable[[int], list[str]]) -> int:
    """Run one engine per call count (`--slots`, or each of `--sweep` in ascending order,
    stopping at the first count that misses a deadline) and report the largest count served
    with zero misses. `engine_argv(n)` is the engine's command line for n slots."""
    counts = sorted(set(args.sweep)) if args.sweep else [args.slots]
    if args.json is not None:
        check_writable(args.json)  # before the first run, not after it
    result: dict[str, Any] = {
        "command": shlex.join(["cadence", *sys.argv[1:]]),  # replayable, quotes and all
        "machine": versions(args.device),
        "seconds": args.seconds,
        "full_context": args.full_context,
        "runs": [],
        "largest_zero_miss_calls": None,
        "complete": False,  # until the sweep ends: a file left by a killed run says so
    }
    # SIGTERM (a `timeout`, a cancelled job) ends the run as Ctrl-C does: engine stopped,
    # segment unlinked, the runs so far reported
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        for calls in counts:
            argv = engine_argv(calls) + (["--test-hooks"] if args.full_context else [])
            run = _hold_calls(calls, args, argv)
            result["runs"].append(run)
            if run.get("zero_misses"):
                result["largest_zero_miss_calls"] = calls
            _report(result, args.json, stdout=False)
            if not run.get("zero_misses"):
                break
    except KeyboardInterrupt:
        result["interrupted"] = True
        _report(result, args.json)
        return INTERRUPTED
    result["complete"] = True
    _report(result, args.json)
    if any("error" in run for run in result["runs"]):
        return 1
    return 0 if result["largest_zero_miss_calls"] == counts[-1] else 3


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _report(result: dict[str, Any], path: Path | None, stdout: bool = True) -> None:
    text = json.dumps(result, indent=1) + "\n"
    if path is not None:  # whole or not at all: a reader (or a kill) never sees half a file
        partial = path.with_name(path.name + ".partial")
        partial.write_text(text)
        partial.replace(path)
    if stdout:
        sys.stdout.write(text)


def _hold_calls(calls: int, args: argparse.Namespace, engine_argv: list[str]) -> dict[str, Any]:
    """Start an engine, open `calls` calls (aged to a full context with --full-context), tick
    for --seconds, read the counters back."""
    runtime = Path(tempfile.mkdtemp(prefix="cadence-bench-"))
    control = runtime / "engine.sock"
    ring = f"cadence-bench-{os.getpid()}-{calls}"
    cmd = [
        sys.executable,
        "-m",
        "cadence",
        "engine",
        f"--control={control}",
        f"--ring={ring}",
        *engine_argv,
    ]
    engine = subprocess.Popen(cmd, preexec_fn=die_with_parent)
    try:
        return _measure(engine, control, calls, args)
    finally:
        stop_child(engine, STOP_TIMEOUT_S)
        unlink_segment(ring)  # a killed engine could not unlink its own
        control.unlink(missing_ok=True)
        runtime.rmdir()


def _measure(
    engine: "subprocess.Popen[bytes]", control: Path, calls: int, args: argparse.Namespace
) -> dict[str, Any]:
    seconds: float = args.seconds
    try:
        if not wait_ready(engine, control, args.ready_timeout):
            return {"calls": calls, "error": "engine not ready"}
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(control))
            for i in range(calls):
                reply = ask(sock, {"op": "open", "call_id": f"bench-{i}"})
                if not reply.get("ok"):
                    log.error("call %d refused: %s", i, reply.get("reason"))
                    return {"calls": calls, "error": f"call {i} refused: {reply.get('reason')}"}
            if args.full_context:
                time.sleep(AGE_AFTER_S)  # every call through its first (resetting) tick
                reply = ask(sock, {"op": "age"})
                if not reply.get("ok"):
                    return {"calls": calls, "error": f"age refused: {reply}"}
            log.info("%d calls open; ticking for %.0f s", calls, seconds)
            first = ask(sock, {"op": "status"})
            start = time.monotonic()
            end = start + seconds
            while time.monotonic() < end:
                time.sleep(min(PROGRESS_EVERY_S, max(0.0, end - time.monotonic())))
                status = ask(sock, {"op": "status"})
                log.info(
                    "ticks %d, missed %d, recent tick ms %s",
                    status["ticks"],
                    status["misses"],
                    status.get("recent_tick_ms"),
                )
            status = ask(sock, {"op": "status"})
            elapsed = time.monotonic() - start
        per_call = status["calls"]
        missed = sum(int(c["misses"]) for c in per_call)
        # every period of the window is a tick run or skipped: one still running (a stall, a
        # hang) is neither yet, and its miss would be counted after the result was read
        counted = status["ticks"] - first["ticks"] + status["skipped"] - first["skipped"]
        unaccounted = max(0, int(elapsed * 1000 / args.tick_ms) - UNACCOUNTED_SLACK - counted)
        return {
            "model": status["model"],
            "executor": status["executor"],
            "calls": calls,
            "ticks": status["ticks"],
            "session_ticks": sum(int(c["ticks"]) for c in per_call),
            "deadline_misses": missed,
            "tick_ms_recent": status.get("recent_tick_ms"),
            # where a tick goes: gather (uplink in), step (the model), scatter (downlink out)
            "phase_ms_recent": status.get("recent_phase_ms"),
            "busy_share": status.get("busy_share"),
            "kernels_per_tick": status.get("kernels_per_tick"),
            "gpu_memory_gb": status.get("gpu_memory_gb"),
            "unaccounted_ticks": unaccounted,
            "zero_misses": missed == 0 and status["misses"] == 0 and unaccounted == 0,
        }
    except (OSError, ValueError, KeyError) as error:  # the engine went away mid-run
        engine.poll()
        log.error("engine lost during the run: %r", error)
        return {"calls": calls, "error": f"engine exited (status {engine.returncode})"}
