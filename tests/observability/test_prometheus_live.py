"""A real Prometheus scraping a real `cadence serve` through an induced incident.

Three aiortc callers fill a three-slot engine; a fourth is refused. Then the engine is made to
miss its deadlines (the --test-hooks stall op on its control socket) and the gateway is frozen
for a second (SIGSTOP), so its callers' uplink frames are missing when the engine ticks
(underruns). Prometheus scrapes both processes every second with the shipped configuration and
rules. Afterwards every dashboard panel's query and every rule's expression must return
series, the burn-rate alert's expression must fire, the per-call records and end-of-call
summaries must show the incident, and exemplars must name the calls.

Deadlines are asserted in counters, never in wall times: the induced stall and freeze give a
known lower bound on misses and underruns whatever else the machine is doing.
"""

import asyncio
import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from engine.control import ask_once
from gateway.ice import restrict_host_candidates
from tests.observability.panels import (
    call_tables,
    expand,
    panel_queries,
    rule_count,
    select,
    without_thresholds,
)
from tests.support.caller import CallResult, band_limited_noise, place_call
from tests.support.prometheus import Prometheus, start_prometheus, stop_prometheus
from tests.support.server import Served, children_of, start_serve, stop_serve

pytestmark = pytest.mark.slow

CALLS = 3
TALK_S = 9.0
STALL_S = 0.6  # a stall, its misses counted; the calls live on (gateway/main.py ENGINE_LOST_S)
FREEZE_S = 1.0
MIN_MISSES = 5  # per call: the stalled tick plus the ticks skipped behind it (about 8)
MIN_UNDERRUNS = 5  # per call: ticks while the gateway is frozen (about 12)
FIRING_ALERT = "CadenceDeadlineMissBudgetBurn"
GPU_ONLY = "cadence_engine_gpu_memory_"  # absent: the echo engine never loads torch

T = TypeVar("T")


@dataclass
class Incident:
    started_s: float  # wall clock, for exemplar queries
    before: dict[str, dict[str, Any]]  # call id -> live record, before the stall
    after_stall: dict[str, dict[str, Any]]
    after_freeze: dict[str, dict[str, Any]]
    responses: dict[str, Any]  # gateway path -> JSON body, taken while the calls were live
    refusal: str
    results: list[CallResult]
    alert_before: list[dict[str, Any]]  # the page alert's expression just before the stall
    alert_data_before: list[dict[str, Any]]  # the same without its thresholds


@dataclass
class Observed:
    served: Served
    prometheus: Prometheus
    incident: Incident


def child_args(served: Served) -> dict[str, tuple[int, list[str]]]:
    """serve's children by role (engine, gateway): pid and argv."""
    found = {}
    for pid in children_of(served.process.pid):
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
        found[argv[3]] = (pid, argv)  # python -m cadence ROLE ...
    return found


def stall_engine(control: str, seconds: float) -> dict[str, Any]:
    return ask_once(Path(control), {"op": "stall", "seconds": seconds})


def eventually(check: Callable[[], T | None], what: str, timeout_s: float = 20.0) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.25)


def alert_query(prometheus: Prometheus, name: str) -> str:
    query: str = next(r for r in prometheus.rules() if r.get("name") == name)["query"]
    return query


async def run_incident(
    served: Served, prometheus: Prometheus, control: str, gateway_pid: int
) -> Incident:
    loop = asyncio.get_running_loop()
    responses: dict[str, Any] = {}

    async def get(path: str) -> Any:
        status, body = await loop.run_in_executor(None, served.get, path)
        assert status == 200, (path, status, body)
        responses[path] = body
        return body

    async def live() -> dict[str, dict[str, Any]]:
        return {r["id"]: r for r in (await get("/v1/calls"))["calls"]}

    async def all_served() -> dict[str, dict[str, Any]]:
        while True:
            records = await live()
            if len(records) == CALLS and all(r["deadline"]["ticks"] > 25 for r in records.values()):
                return records
            await asyncio.sleep(0.2)

    started_s = time.time()
    noise = band_limited_noise(TALK_S + 1.0)
    calls = [asyncio.create_task(place_call(served.url, noise, TALK_S)) for _ in range(CALLS)]
    await asyncio.wait_for(all_served(), 15.0)
    with pytest.raises(RuntimeError) as refused:
        await place_call(served.url, noise, 0.0)

    before = await live()
    page = alert_query(prometheus, FIRING_ALERT)
    alert_before = await loop.run_in_executor(None, prometheus.query, page)
    alert_data = await loop.run_in_executor(None, prometheus.query, without_thresholds(page))
    assert await loop.run_in_executor(None, stall_engine, control, STALL_S) == {"ok": True}
    await asyncio.sleep(STALL_S + 0.5)
    after_stall = await live()
    os.kill(gateway_pid, signal.SIGSTOP)
    try:
        await asyncio.sleep(FREEZE_S)
    finally:
        os.kill(gateway_pid, signal.SIGCONT)
    await asyncio.sleep(0.5)
    after_freeze = await live()
    await get(f"/v1/calls/{next(iter(after_freeze))}")
    results = await asyncio.gather(*calls)
    return Incident(
        started_s,
        before,
        after_stall,
        after_freeze,
        responses,
        str(refused.value),
        results,
        alert_before,
        alert_data,
    )


@pytest.fixture(scope="module")
def observed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Observed]:
    restrict_host_candidates(["127.0.0.1"])
    workdir = tmp_path_factory.mktemp("observed")
    served = start_serve(workdir / "serve.log", f"--slots={CALLS}", "--test-hooks")
    try:
        prometheus = start_prometheus(
            workdir, f"127.0.0.1:{served.metrics_port}", f"127.0.0.1:{served.port}"
        )
        try:
            # Prometheus hands its targets to the scrapers a few seconds after it starts
            eventually(lambda: len(prometheus.query("up")) == 2, "the first scrapes")
            children = child_args(served)
            _, engine_argv = children["engine"]
            control = engine_argv[engine_argv.index("--control") + 1]
            gateway_pid, _ = children["gateway"]
            incident = asyncio.run(run_incident(served, prometheus, control, gateway_pid))
            # the last scrape after the calls ended, and a rule evaluation after it
            eventually(
                lambda: prometheus.value("sum(cadence_gateway_calls_total)") >= CALLS,
                "the ended calls to be scraped",
            )
            yield Observed(served, prometheus, incident)
        finally:
            stop_prometheus(prometheus)
    finally:
        stop_serve(served)


def test_both_processes_are_scraped_and_the_shipped_rules_are_loaded(observed: Observed) -> None:
    prometheus = observed.prometheus
    assert prometheus.target_health() == {"cadence-engine": "up", "cadence-gateway": "up"}
    assert len(prometheus.rules()) == rule_count()


def test_a_full_engine_refuses_the_next_call(observed: Observed) -> None:
    assert "503" in observed.incident.refusal
    assert "engine_full" in observed.incident.refusal
    refused = 'sum(cadence_gateway_admission_refusals_total{reason="full"})'
    assert observed.prometheus.value(refused) >= 1


def test_the_stall_and_the_freeze_move_every_calls_record(observed: Observed) -> None:
    incident = observed.incident
    assert set(incident.before) == set(incident.after_freeze)
    for call_id, before in incident.before.items():
        stalled = incident.after_stall[call_id]["deadline"]
        frozen = incident.after_freeze[call_id]["deadline"]
        assert stalled["missed"] - before["deadline"]["missed"] >= MIN_MISSES, stalled
        assert frozen["underruns"] - stalled["underruns"] >= MIN_UNDERRUNS, frozen
        # the gateway knows the frames it could not deliver while it was frozen (one of slack:
        # a record read between a tick's underrun and the gateway's late write of its frame)
        late = incident.after_freeze[call_id]["uplink"]["late_frames"]
        late -= incident.after_stall[call_id]["uplink"]["late_frames"]
        assert late + 1 >= frozen["underruns"] - stalled["underruns"] >= MIN_UNDERRUNS
        assert 0 < frozen["miss_ratio"] < 1
        assert frozen["ticks"] > before["deadline"]["ticks"]
        assert frozen["jitter_delay_p50_s"] is not None
        latency = frozen["server_latency_estimate"]
        assert latency["total_s"] > latency["engine_s"] >= 0.08


def test_every_end_of_call_summary_carries_its_deadline_statistics(observed: Observed) -> None:
    summaries = {}
    for line in observed.served.log().splitlines():
        _, found, text = line.partition("call summary ")
        if found:
            record = json.loads(text)
            summaries[record["id"]] = record
    for result in observed.incident.results:
        deadline = summaries[result.call_id]["deadline"]
        assert deadline["missed"] >= MIN_MISSES
        assert deadline["underruns"] >= MIN_UNDERRUNS
        assert deadline["ticks"] >= TALK_S / 0.08 * 0.5
        assert summaries[result.call_id]["end_reason"] == "hangup"


def test_the_miss_counters_and_the_burn_rate_alert_see_the_stall(observed: Observed) -> None:
    prometheus = observed.prometheus
    misses = prometheus.value("sum(cadence_engine_call_deadline_misses_total)")
    assert misses >= CALLS * MIN_MISSES
    assert prometheus.value("sum(cadence_engine_deadline_misses_total)") >= MIN_MISSES
    assert prometheus.value("sum(cadence_engine_underruns_total)") >= CALLS * MIN_UNDERRUNS
    late = prometheus.value("sum(cadence_gateway_late_frames_total)")
    assert late >= CALLS * MIN_UNDERRUNS
    assert observed.incident.alert_data_before, "the alert's ratios had data before the stall"
    assert observed.incident.alert_before == [], "and the alert did not fire on healthy calls"
    page = alert_query(prometheus, FIRING_ALERT)
    series = eventually(lambda: prometheus.query(page), "the alert expression")
    assert {s["metric"]["instance"] for s in series} == {
        f"127.0.0.1:{observed.served.metrics_port}"
    }
    state = eventually(
        lambda: (
            next(r for r in prometheus.rules() if r.get("name") == FIRING_ALERT)["state"]
            in ("pending", "firing")
        ),
        "Prometheus to hold the alert active",
    )
    assert state


def test_every_rule_evaluates_and_returns_series(observed: Observed) -> None:
    prometheus = observed.prometheus
    eventually(
        lambda: all(r["health"] == "ok" for r in prometheus.rules()), "every rule to be evaluated"
    )
    empty = []
    for rule in prometheus.rules():
        expr = rule["query"] if rule["type"] == "recording" else without_thresholds(rule["query"])
        if not prometheus.query(expr):
            empty.append(f"{rule['name']}: {expr}")
    assert empty == []


def test_every_dashboard_panel_query_returns_series(observed: Observed) -> None:
    prometheus = observed.prometheus
    queries = panel_queries()
    assert len(queries) > 40
    empty = []
    for query in queries:
        series = prometheus.query(query.expr)
        if GPU_ONLY in query.expr:
            assert series == [], f"GPU memory without CUDA: {query}"
        elif not series:
            empty.append(str(query))
    assert empty == []


def test_the_call_tables_read_fields_the_records_have(observed: Observed) -> None:
    responses = observed.incident.responses
    call_id = next(iter(observed.incident.after_freeze))
    tables = call_tables()
    assert len(tables) == 2
    for table in tables:
        body = responses[expand(table.url, {"gateway_url": "", "call_id": call_id})]
        rows = select(body, table.root) if table.root else [body]
        assert rows, table
        for row in rows:
            for selector in table.selectors:
                select(row, selector)  # KeyError names a column the record lacks


def test_exemplars_name_the_calls_behind_misses_and_delays(observed: Observed) -> None:
    prometheus = observed.prometheus
    call_ids = {result.call_id for result in observed.incident.results}
    for metric in (
        "cadence_engine_call_deadline_misses_total",
        "cadence_engine_underruns_total",
        "cadence_gateway_jitter_buffer_delay_seconds_bucket",
        "cadence_gateway_call_setup_duration_seconds_bucket",
    ):
        found = prometheus.exemplars(metric, observed.incident.started_s)
        named = {e["labels"].get("call_id") for group in found for e in group["exemplars"]}
        assert named & call_ids, f"{metric}: exemplars {named}"
