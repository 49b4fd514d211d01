"""What the shipped dashboards and rules ask of Prometheus and of the gateway.

Grafana expands template variables before a query reaches Prometheus; here they are expanded
the way a dashboard opened on "All" would: instance selectors match every target, rate
windows are one minute (enough samples at the test's one-second scrape).
"""

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
DASHBOARDS = DEPLOY / "grafana" / "dashboards"
RULES = DEPLOY / "prometheus" / "rules"

GRAFANA_VARIABLES = {
    "__rate_interval": "1m",
    "__interval": "5s",
    "__range": "5m",
    "engine": ".+",
    "gateway": ".+",
}
PROMETHEUS_DS = "prometheus"
CALLS_DS = "yesoreyeram-infinity-datasource"
_VARIABLE = re.compile(r"\$\{?(\w+)\}?")
_COMPARISON = re.compile(r"(==|!=|>=|<=|>|<)(?!\s*bool)")


@dataclass(frozen=True)
class PanelQuery:
    dashboard: str
    panel: str
    expr: str  # variables expanded

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel}: {self.expr}"


@dataclass(frozen=True)
class CallTable:
    """A table panel that reads the gateway's call records (Infinity JSON datasource)."""

    dashboard: str
    panel: str
    url: str  # with ${gateway_url} and ${call_id} unexpanded
    root: str  # "" when the response itself is the one row
    selectors: tuple[str, ...]


def expand(expr: str, variables: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in variables:
            raise KeyError(f"no value for Grafana variable ${name} in {expr!r}")
        return variables[name]

    return _VARIABLE.sub(one, expr)


def dashboards() -> dict[str, dict[str, Any]]:
    return {path.name: json.loads(path.read_text()) for path in sorted(DASHBOARDS.glob("*.json"))}


def _targets(board: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            yield panel["title"], target


def panel_queries() -> list[PanelQuery]:
    found = []
    for name, board in dashboards().items():
        for title, target in _targets(board):
            if target["datasource"]["type"] == PROMETHEUS_DS:
                found.append(PanelQuery(name, title, expand(target["expr"], GRAFANA_VARIABLES)))
    return found


def call_tables() -> list[CallTable]:
    found = []
    for name, board in dashboards().items():
        for title, target in _targets(board):
            if target["datasource"]["type"] == CALLS_DS:
                selectors = tuple(c["selector"] for c in target["columns"])
                found.append(
                    CallTable(name, title, target["url"], target["root_selector"], selectors)
                )
    return found


def select(row: dict[str, Any], selector: str) -> Any:
    """A dotted selector's value in one JSON row; KeyError when the path is not there."""
    value: Any = row
    for key in selector.split("."):
        value = value[key]
    return value


def rule_count() -> int:
    """Rules in the shipped rule files, counted from their text (no YAML parser needed)."""
    text = "".join(path.read_text() for path in RULES.glob("*.yml"))
    return len(re.findall(r"^\s*- (?:record|alert):", text, re.MULTILINE))


def without_thresholds(expr: str) -> str:
    """An alert expression with every comparison made `bool`: series wherever its data is.

    An alert's own expression returns series only while it fires; this form shows that every
    series the alert compares exists and evaluates, whatever the thresholds.
    """
    return _COMPARISON.sub(r"\1 bool", expr)
