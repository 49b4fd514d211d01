"""The shipped Prometheus and Grafana files: promtool accepts them, dashboards hold together.

promtool is Debian's `prometheus` package (the CI installs it); these tests skip without it.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from engine.metrics import EngineMetrics
from gateway.metrics import GatewayMetrics
from tests.observability.panels import DEPLOY, RULES, dashboards, panel_queries

PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian prometheus)")
PROVISIONED_UIDS = {"cadence-prometheus", "cadence-calls"}


def promtool(*args: str | Path) -> str:
    assert PROMTOOL is not None
    run = subprocess.run([PROMTOOL, *map(str, args)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout + run.stderr


@needs_promtool
def test_promtool_accepts_the_scrape_config_and_finds_both_rule_files() -> None:
    out = promtool("check", "config", DEPLOY / "prometheus" / "prometheus.yml")
    assert "SUCCESS: 2 rule files found" in out


@needs_promtool
def test_promtool_accepts_the_rules() -> None:
    out = promtool("check", "rules", *sorted(RULES.glob("*.yml")))
    assert out.count("SUCCESS") == 2


@needs_promtool
def test_burn_rate_alerts_fire_on_the_engine_that_burns_and_wait_for_their_window() -> None:
    out = promtool("test", "rules", DEPLOY / "prometheus" / "tests" / "cadence-alerts-test.yml")
    assert "SUCCESS" in out


def test_dashboards_have_unique_uids_fit_the_grid_and_use_provisioned_datasources() -> None:
    boards = dashboards()
    assert len(boards) == 4, "fleet, engine, gateway and per-call"
    uids = [board["uid"] for board in boards.values()]
    assert len(set(uids)) == len(uids)
    provisioning = (DEPLOY / "grafana" / "provisioning" / "datasources" / "cadence.yml").read_text()
    for uid in PROVISIONED_UIDS:
        assert f"uid: {uid}" in provisioning
    for name, board in boards.items():
        ids = [panel["id"] for panel in board["panels"]]
        assert len(set(ids)) == len(ids), name
        for panel in board["panels"]:
            pos = panel["gridPos"]
            assert pos["x"] + pos["w"] <= 24, f"{name} / {panel['title']}"
            assert panel.get("description") or panel["type"] == "text", panel["title"]
            for target in panel.get("targets", []):
                assert target["datasource"]["uid"] in PROVISIONED_UIDS, panel["title"]


def test_the_fleet_dashboard_draws_tick_quantiles_against_the_80_ms_deadline() -> None:
    fleet = dashboards()["cadence-fleet.json"]
    panel = next(p for p in fleet["panels"] if p["title"].startswith("Tick duration"))
    exprs = [t["expr"] for t in panel["targets"]]
    assert any(e.startswith("histogram_quantile(0.5,") for e in exprs)
    assert any(e.startswith("histogram_quantile(0.99,") for e in exprs)
    assert "vector(0.08)" in exprs
    steps = panel["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps[-1]["value"] == 0.08


def test_every_metric_is_on_a_dashboard_or_in_a_rule() -> None:
    shipped = "\n".join(q.expr for q in panel_queries())
    shipped += "".join(path.read_text() for path in RULES.glob("*.yml"))
    used = set(re.findall(r"cadence_[a-z0-9_]+", shipped))
    missing = []
    for registry in (EngineMetrics().registry, GatewayMetrics().registry):
        for family in registry.collect():
            names = {s.name for s in family.samples if not s.name.endswith("_created")}
            if not names & used:
                missing.append(family.name)
    assert missing == [], f"metrics nobody looks at: {missing}"
