"""Running SIPp (Debian `sip-tester`) against a test's `cadence serve`.

Each run gets its own local SIP port and working directory; SIPp's exit status is 0 only when
every call of the scenario succeeded, and its error log is attached to any failure.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.support.server import free_port

SIPP = "/usr/bin/sipp"
SCENARIOS = Path(__file__).resolve().parent / "scenarios"


@dataclass
class Sipp:
    process: subprocess.Popen[bytes]
    workdir: Path

    def wait(self, timeout_s: float) -> int:
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def errors(self) -> str:
        logs = sorted(self.workdir.glob("*errors.log")) + sorted(self.workdir.glob("*.out"))
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in logs)


def start_sipp(
    workdir: Path,
    scenario: str,
    sip_port: int | None,
    *,
    local_port: int | None = None,
    calls: int = 1,
    duration_ms: int = 1000,
    keys: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> Sipp:
    workdir.mkdir(parents=True, exist_ok=True)
    cmd = [
        SIPP,
        *([f"127.0.0.1:{sip_port}"] if sip_port is not None else []),  # none: SIPp answers
        "-sf",
        str(SCENARIOS / scenario),
        "-i",
        "127.0.0.1",
        "-mi",
        "127.0.0.1",
        "-p",
        str(local_port or free_port()),
        "-m",
        str(calls),
        "-d",
        str(duration_ms),
        "-nostdin",
        "-trace_err",
        "-timeout",
        "60s",
        "-timeout_error",
        *extra,
    ]
    for key, value in (keys or {}).items():
        cmd += ["-key", key, value]
    out = (workdir / "sipp.out").open("wb")
    process = subprocess.Popen(
        cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
    )
    return Sipp(process, workdir)


def run_sipp(
    workdir: Path,
    scenario: str,
    sip_port: int,
    *,
    duration_ms: int = 1000,
    keys: dict[str, str] | None = None,
    extra: tuple[str, ...] = (),
) -> Sipp:
    """Run a one-call scenario to its end."""
    sipp = start_sipp(workdir, scenario, sip_port, duration_ms=duration_ms, keys=keys, extra=extra)
    sipp.wait(90.0)
    return sipp
