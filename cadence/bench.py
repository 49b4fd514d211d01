"""`cadence bench engine`: hold N calls on a real engine, on the real 80 ms clock, and count.

It starts an engine process exactly as `cadence engine` would, opens N calls through the
admission socket (the slots are live; their uplink is silence, which costs the model what
speech costs), lets the engine tick for the given time, and reads back the per-call counters:
session-ticks served, deadline misses, and tick time (release to outputs published)
percentiles. The verdict is zero misses or not; nothing is extrapolated. Attention skips the
ring entries a young call has not written, so only a run longer than the KV context (2 minutes
by default) measures the worst case, every ring full: the default is 130 s.

Results are written as JSON with the machine, versions and the command.
"""

import argparse
import json
import logging
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from cadence.supervise import engine_status
from engine.control import ask

log = logging.getLogger(__name__)

PROGRESS_EVERY_S = 10.0


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version(), "platform": platform.platform()}
    try:
        import torch

        found["torch"] = torch.__version__
        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name()
            found["cuda"] = str(torch.version.cuda)
    except ImportError:
        pass
    return found


def bench_engine(args: argparse.Namespace, engine_argv: list[str]) -> int:
    runtime = Path(tempfile.mkdtemp(prefix="cadence-bench-"))
    control = runtime / "engine.sock"
    cmd = [
        sys.executable,
        "-m",
        "cadence",
        "engine",
        f"--control={control}",
        f"--ring=cadence-bench-{os.getpid()}",
        *engine_argv,
    ]
    engine = subprocess.Popen(cmd)
    try:
        deadline = time.monotonic() + args.ready_timeout
        status: dict[str, Any] | None = None
        while status is None or status.get("state") != "ready":
            if engine.poll() is not None or time.monotonic() > deadline:
                log.error("the engine did not become ready")
                return 1
            time.sleep(0.2)
            status = engine_status(control)
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(control))
            for i in range(args.slots):
                reply = ask(sock, {"op": "open", "call_id": f"bench-{i}"})
                if not reply.get("ok"):
                    log.error("call %d refused: %s", i, reply.get("reason"))
                    return 1
            log.info("%d calls open; ticking for %.0f s", args.slots, args.seconds)
            end = time.monotonic() + args.seconds
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
        calls = status["calls"]
        session_ticks = sum(int(c["ticks"]) for c in calls)
        missed = sum(int(c["misses"]) for c in calls)
        result = {
            "command": " ".join(["cadence", *sys.argv[1:]]),
            "machine": _versions(),
            "model": status["model"],
            "executor": status["executor"],
            "calls": args.slots,
            "seconds": args.seconds,
            "ticks": status["ticks"],
            "session_ticks": session_ticks,
            "deadline_misses": missed,
            "tick_ms_recent": status.get("recent_tick_ms"),
            "zero_misses": missed == 0 and status["misses"] == 0,
        }
        text = json.dumps(result, indent=1)
        if args.json:
            args.json.write_text(text + "\n")
        sys.stdout.write(text + "\n")
        return 0 if result["zero_misses"] else 3
    finally:
        if engine.poll() is None:
            engine.send_signal(signal.SIGTERM)
            try:
                engine.wait(30)
            except subprocess.TimeoutExpired:
                engine.kill()
        control.unlink(missing_ok=True)
        runtime.rmdir()
