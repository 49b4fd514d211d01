"""A real `cadence serve` in a child process, on free ports, for end-to-end tests."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Served:
    process: "subprocess.Popen[bytes]"
    port: int
    metrics_port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, Any]:
        return http_json("GET", self.url + path)

    def engine_metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics") as r:
            text = r.read().decode()
        values: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def log(self) -> str:
        return self.log_path.read_text()


def http_json(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def start_serve(log_path: Path, *extra: str, timeout_s: float = 30.0) -> Served:
    port, metrics_port = free_port(), free_port()
    cmd = [
        sys.executable,
        "-m",
        "cadence",
        "serve",
        f"--port={port}",
        f"--metrics-port={metrics_port}",
        "--ice-address=127.0.0.1",
        *extra,
    ]
    with log_path.open("wb") as log:  # the child keeps its own descriptor
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    served = Served(process, port, metrics_port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"cadence serve exited early:\n{served.log()}")
        try:
            status, _ = served.get("/healthz")
            if status == 200:
                return served
        except OSError:
            pass
        time.sleep(0.1)
    stop_serve(served)
    raise RuntimeError(f"cadence serve did not become healthy:\n{served.log()}")


def children_of(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rpartition(")")[2].split()[1]) == pid:
                found.append(int(entry))
    return found


def stop_serve(served: Served, sig: int = signal.SIGTERM, timeout_s: float = 20.0) -> int:
    served.process.send_signal(sig)
    try:
        return served.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        served.process.kill()
        served.process.wait()
        raise


def engine_control(served: Served) -> Path:
    """The control socket of serve's engine child, from its command line."""
    for pid in children_of(served.process.pid):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
        if "engine" in argv and "--control" in argv:
            return Path(argv[argv.index("--control") + 1])
    raise AssertionError("serve has no engine child")
