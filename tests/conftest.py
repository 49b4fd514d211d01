"""Suite-wide options.

`--strict-skips` (what `scripts/test`, and so CI, runs with) turns every skip into a failure
except those of tests marked `gpu` or `interpreter`: a test that skips because a tool is
missing (SIPp, Prometheus, Chromium, the `moshi` reference, triton, Playwright) would otherwise
let CI pass without testing what it claims to. Only the GPU tests may skip on a machine without
CUDA, and only the interpreter-only kernel tests on a machine with it.
"""

import importlib.util
from collections.abc import Generator

import pytest

# modules a test imports at collection time, where a missing one would drop whole files
REQUIRED_MODULES = ("torch", "moshi", "triton", "playwright", "hypothesis")
# skips that depend on the machine, not on a missing tool: no CUDA, or CUDA (see pyproject)
EXEMPT_MARKS = ("gpu", "interpreter")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--strict-skips",
        action="store_true",
        help="fail every skipped test not marked gpu or interpreter (CI runs with it)",
    )


def pytest_configure(config: pytest.Config) -> None:
    if not config.getoption("strict_skips"):
        return
    missing = [name for name in REQUIRED_MODULES if importlib.util.find_spec(name) is None]
    if missing:
        raise pytest.UsageError(
            f"--strict-skips: {', '.join(missing)} not installed (scripts/setup --test)"
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    outcome = yield
    report = outcome.get_result()
    strict = item.config.getoption("strict_skips")
    exempt = any(item.get_closest_marker(mark) for mark in EXEMPT_MARKS)
    if strict and report.skipped and not exempt:
        if hasattr(report, "wasxfail"):
            return
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped without a gpu/interpreter mark under --strict-skips: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(
    collector: pytest.Collector,
) -> Generator[None, pytest.CollectReport, None]:
    outcome = yield
    report = outcome.get_result()
    if report.skipped and collector.config.getoption("strict_skips"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"module skipped under --strict-skips: {reason}"
