"""A real Prometheus in a child process, scraping a test's `cadence serve`, queried over HTTP.

The scrape configuration is the one shipped in deploy/prometheus/prometheus.yml with its
targets, intervals and rule path swapped for the test's: what is tested is what operators
run. Each swap must match exactly once, so the test breaks loudly if the shipped file drifts.
"""

import json
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROMETHEUS = Path("/usr/bin/prometheus")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
SCRAPE_S = 1


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scrape_config_for(engine_target: str, gateway_target: str) -> str:
    """The shipped config, pointed at this test's processes and scraped every second."""
    text = (DEPLOY / "prometheus.yml").read_text()
    swaps = {
        '["localhost:9101"]': json.dumps([engine_target]),
        '["localhost:8080"]': json.dumps([gateway_target]),
        "scrape_interval: 5s": f"scrape_interval: {SCRAPE_S}s",
        "evaluation_interval: 15s": f"evaluation_interval: {SCRAPE_S}s",
        "  - rules/*.yml": f"  - {DEPLOY / 'rules'}/*.yml",
    }
    for old, new in swaps.items():
        if text.count(old) != 1:
            raise AssertionError(f"deploy/prometheus/prometheus.yml no longer has {old!r} once")
        text = text.replace(old, new)
    return text


@dataclass
class Prometheus:
    process: "subprocess.Popen[bytes]"
    port: int
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        query = urllib.parse.urlencode(params)
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{query}"
        with urllib.request.urlopen(url, timeout=10) as r:
            body = json.loads(r.read())
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's series (each {"metric": labels, "value": [t, v]})."""
        data = self.api("query", query=expr)
        if data["resultType"] != "vector":
            raise AssertionError(f"{expr!r} gave a {data['resultType']}, not a vector")
        result: list[dict[str, Any]] = data["result"]
        return result

    def value(self, expr: str) -> float:
        """The one value of an expression that aggregates to a single series (0 if none)."""
        series = self.query(expr)
        return float(series[0]["value"][1]) if series else 0.0

    def rules(self) -> list[dict[str, Any]]:
        return [rule for group in self.api("rules")["groups"] for rule in group["rules"]]

    def exemplars(self, expr: str, start_s: float) -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = self.api(
            "query_exemplars", query=expr, start=str(start_s), end=str(time.time())
        )
        return found

    def target_health(self) -> dict[str, str]:
        targets = self.api("targets")["activeTargets"]
        return {t["labels"]["job"]: t["health"] for t in targets}

    def log(self) -> str:
        return self.log_path.read_text()


def start_prometheus(
    workdir: Path, engine_target: str, gateway_target: str, timeout_s: float = 30.0
) -> Prometheus:
    config = workdir / "prometheus.yml"
    config.write_text(scrape_config_for(engine_target, gateway_target))
    port = free_port()
    log_path = workdir / "prometheus.log"
    cmd = [
        str(PROMETHEUS),
        f"--config.file={config}",
        f"--storage.tsdb.path={workdir / 'tsdb'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--enable-feature=exemplar-storage",
        "--log.level=warn",
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    prometheus = Prometheus(process, port, log_path)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited early:\n{prometheus.log()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=1) as r:
                if r.status == 200:
                    return prometheus
        except OSError:
            pass
        time.sleep(0.1)
    stop_prometheus(prometheus)
    raise RuntimeError(f"prometheus did not become ready:\n{prometheus.log()}")


def stop_prometheus(prometheus: Prometheus, timeout_s: float = 10.0) -> None:
    prometheus.process.terminate()
    try:
        prometheus.process.wait(timeout_s)
    except subprocess.TimeoutExpired:
        prometheus.process.kill()
        prometheus.process.wait()
