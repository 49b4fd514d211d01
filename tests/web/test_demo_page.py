"""The demo page in real headless Chromium against a real `cadence serve`.

The microphone is Chromium's fake capture device playing a WAV of tone bursts; the page
measures its own input and the returned track through WebAudio and keeps the levels on
`window.cadence`, which is what these tests read. Assertions are on counters and page
state, with bounded waits, never on wall-clock timings.
"""

import json
import os
import signal
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Route
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from tests.support.server import Served, children_of, http_json, start_serve, stop_serve
from tests.support.tokenizer import train_tiny_tokenizer
from tests.web.chromium import chromium, launch, tone_bursts

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "artifacts"
TOKEN = "demo-token-0123456789abcdef"
LIVE_WAIT_MS = 20_000
MIN_TICKS_MET = 60  # about 5 s of deadlines


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    wav = tone_bursts(tmp_path_factory.mktemp("mic") / "bursts.wav")
    with chromium(wav) as b:
        yield b


@pytest.fixture
def served(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Served]:
    args: tuple[str, ...] = getattr(request, "param", ())  # extra `cadence serve` flags
    served = start_serve(tmp_path / "serve.log", *args)
    yield served
    if served.process.poll() is None:
        stop_serve(served)


class Pages:
    """Opens the demo page in fresh browser contexts, closed together when the test ends."""

    def __init__(self, browser: Browser) -> None:
        self._browser = browser
        self._contexts: list[BrowserContext] = []

    def new_page(self, width: int = 1280, height: int = 900) -> Page:
        """A blank page in a fresh context."""
        context = self._browser.new_context(viewport={"width": width, "height": height})
        self._contexts.append(context)
        return context.new_page()

    def open(self, url: str, width: int = 1280, height: int = 900) -> Page:
        page = self.new_page(width, height)
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.goto(url)
        page.wait_for_function("window.cadence && !document.getElementById('call').disabled")
        assert errors == [], errors
        return page

    def close(self) -> None:
        for context in self._contexts:
            context.close()


@pytest.fixture
def pages(browser: Browser) -> Iterator[Pages]:
    opened = Pages(browser)
    yield opened
    opened.close()


def call_live(page: Page) -> None:
    page.click("#call")
    page.wait_for_function("window.cadence.state === 'live'", timeout=LIVE_WAIT_MS)


def wait_notice(page: Page, kind: str, timeout_ms: int = LIVE_WAIT_MS) -> str:
    try:
        page.wait_for_selector(f'#notice[data-kind="{kind}"]', state="visible", timeout=timeout_ms)
    except PlaywrightTimeout:
        shown = page.evaluate("[window.cadence.state, window.cadence.notice]")
        raise AssertionError(f"no {kind} notice; the page is {shown}") from None
    return page.inner_text("#notice-text")


def live_calls(served: Served, token: str | None = None) -> list[dict[str, Any]]:
    request = urllib.request.Request(served.url + "/v1/calls")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as reply:
        return list(json.loads(reply.read())["calls"])


def wait_calls_empty(served: Served, token: str | None = None, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while calls := live_calls(served, token):
        assert time.monotonic() < deadline, f"calls still live: {calls}"
        time.sleep(0.2)


def best_lag_correlation(trace: list[list[float]], max_lag: int = 50) -> tuple[float, int]:
    """Correlation of output level with input level at the best lag (in 20 ms samples)."""
    levels = np.asarray(trace)[:, 1:]
    x, y = levels[:, 0], levels[:, 1]
    scores = [float(np.corrcoef(x[: x.size - lag], y[lag:])[0, 1]) for lag in range(max_lag)]
    lag = int(np.nanargmax(scores))
    return scores[lag], lag


def child_pid(served: Served, role: str) -> int:
    """The pid of serve's `cadence engine` or `cadence gateway` child."""
    for pid in children_of(served.process.pid):
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        if f"cadence {role}" in cmdline:
            return pid
    raise AssertionError(f"serve has no {role} child")


def test_a_call_echoes_meets_deadlines_and_hangs_up(pages: Pages, served: Served) -> None:
    page = pages.open(served.url)
    assert page.get_attribute("#captions", "data-state") == "unavailable"
    assert "when a language model is served" in page.inner_text("#captions")
    call_live(page)
    page.wait_for_function(f"window.cadence.panel.values.met >= {MIN_TICKS_MET}", timeout=30_000)
    page.wait_for_function("window.cadence.panel.values.rtt !== undefined", timeout=10_000)

    trace = page.evaluate("window.cadence.meters.trace.slice(-300)")
    corr, lag = best_lag_correlation(trace)
    out_peak = max(sample[2] for sample in trace)
    assert out_peak > 0.05, f"nothing came back (peak output RMS {out_peak:.3f})"
    assert corr > 0.7, f"returned energy does not follow the input (r={corr:.2f} at lag {lag})"
    assert lag > 0, "the echo cannot arrive before the sound it echoes"

    values = page.evaluate("window.cadence.panel.values")
    assert values["connection"] == "connected"
    assert int(page.inner_text('[data-stat="met"]').replace(",", "")) >= MIN_TICKS_MET
    assert page.inner_text('[data-stat="missed"]').isdigit()
    assert values["load"] == 1  # this call, in the engine's slots
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "demo-call.png"))

    page.set_viewport_size({"width": 390, "height": 844})  # a phone
    fits = "document.scrollingElement.scrollWidth <= window.innerWidth"
    assert page.evaluate(fits), "the page scrolls sideways on a phone"
    assert page.is_visible("#hangup")
    page.screenshot(path=str(ARTIFACTS / "demo-call-phone.png"), full_page=True)

    call_id = page.evaluate("window.cadence.session.id")
    page.click("#hangup")
    wait_calls_empty(served)
    assert served.get("/v1/calls") == (200, {"calls": []})
    status, ended = served.get(f"/v1/calls/{call_id}")  # why it ended, for a page still asking
    assert (status, ended["error"], ended["call"]["end_reason"]) == (410, "call_ended", "hangup")
    assert ended["call"]["engine"]["ticks"] >= MIN_TICKS_MET
    assert page.evaluate("window.cadence.state") == "idle"
    assert page.is_visible("#call")


@pytest.mark.parametrize("served", [("--slots=1",)], indirect=True)
def test_a_full_server_is_explained_and_the_call_goes_through_later(
    pages: Pages, served: Served
) -> None:
    holder = pages.open(served.url)
    call_live(holder)
    page = pages.open(served.url)
    page.click("#call")
    assert "Server full" in wait_notice(page, "server-full")
    assert page.evaluate("window.cadence.state") == "idle"
    assert len(live_calls(served)) == 1

    holder.click("#hangup")
    wait_calls_empty(served)
    page.click("#notice-action")  # "Try again"
    page.wait_for_function("window.cadence.state === 'live'", timeout=LIVE_WAIT_MS)
    assert page.is_hidden("#notice")
    page.click("#hangup")
    wait_calls_empty(served)


def test_a_dead_engine_ends_the_call_with_a_clear_message(pages: Pages, served: Served) -> None:
    page = pages.open(served.url)
    call_live(page)
    os.kill(child_pid(served, "engine"), signal.SIGKILL)
    page.wait_for_function("window.cadence.notices.includes('engine-down')", timeout=20_000)
    assert page.evaluate("window.cadence.state") == "ended"
    assert page.is_visible("#call")
    assert served.get("/v1/calls") == (200, {"calls": []})

    # serve restarts its engine; the page notices, and the next call goes through
    assert "engine is back" in wait_notice(page, "engine-back", timeout_ms=60_000)
    page.click("#notice-action")
    page.wait_for_function("window.cadence.state === 'live'", timeout=LIVE_WAIT_MS)
    page.click("#hangup")
    wait_calls_empty(served)


def test_a_server_that_stops_mid_call_says_so(pages: Pages, served: Served) -> None:
    page = pages.open(served.url)
    call_live(page)
    served.process.send_signal(signal.SIGTERM)  # serve stops: its gateway ends every call
    assert "restarting" in wait_notice(page, "engine-draining", timeout_ms=10_000)
    assert page.evaluate("window.cadence.state") == "ended"
    assert "network-lost" not in page.evaluate("window.cadence.notices")
    assert served.process.wait(30) == 0


def test_no_call_starts_before_the_page_has_its_config(pages: Pages, served: Served) -> None:
    page = pages.new_page()
    held: list[Route] = []
    page.route("**/v1/config", lambda route: held.append(route))  # the server is slow
    page.goto(served.url)
    page.wait_for_function("window.cadence !== undefined")
    page.wait_for_timeout(300)
    assert held, "the page asked for its config"
    assert page.is_disabled("#call")  # (a disabled button takes no click, scripted or not)
    assert page.evaluate("[window.cadence.state, window.cadence.notice]") == ["idle", None]
    held[0].continue_()
    page.wait_for_function("!document.getElementById('call').disabled")
    call_live(page)
    page.click("#hangup")
    wait_calls_empty(served)


def test_an_engine_still_starting_is_explained_with_its_retry(pages: Pages, served: Served) -> None:
    page = pages.open(served.url)
    starting = {"error": "engine_starting", "detail": "engine refused the call: starting"}
    page.route(  # the answer a gateway gives while its engine warms up
        "**/v1/calls",
        lambda route: route.fulfill(status=503, json=starting, headers={"Retry-After": "5"}),
    )
    page.click("#call")
    text = wait_notice(page, "engine-starting")
    assert "still starting" in text
    assert "Try again in 5 s" in text
    assert page.evaluate("window.cadence.state") == "idle"


AUTH_SERVE_ARGS = (
    f"--auth-token={TOKEN}",
    "--ice-server=stun:stun.invalid:3478",
    "--ice-server=turn:turn.invalid:3478?transport=udp",
    "--turn-username=demo",
    "--turn-credential=secret",
)


@pytest.mark.parametrize("served", [AUTH_SERVE_ARGS], indirect=True)
def test_a_token_protected_server_asks_for_the_token(pages: Pages, served: Served) -> None:
    status, config = served.get("/v1/config")
    assert status == 200
    assert config["auth"] == "bearer"
    assert TOKEN not in str(config), "the token must never be served"
    assert config["ice_servers"] == [
        {"urls": "stun:stun.invalid:3478"},
        {
            "urls": "turn:turn.invalid:3478?transport=udp",
            "username": "demo",
            "credential": "secret",
        },
    ]
    assert served.get("/v1/calls")[0] == 401
    assert http_json("POST", served.url + "/v1/calls", {"sdp": "v=0"})[0] == 401

    page = pages.open(served.url)
    assert page.is_visible("#auth")
    page.click("#call")
    wait_notice(page, "unauthorized")
    page.fill("#token", TOKEN)
    page.click("#auth button")
    call_live(page)
    assert len(live_calls(served, TOKEN)) == 1
    page.click("#hangup")
    wait_calls_empty(served, TOKEN)


LINK_TOKEN = "demo+token/0123456789abcdef=="  # base64's "+" and "/" and "="


@pytest.mark.parametrize("served", [(f"--auth-token={LINK_TOKEN}",)], indirect=True)
def test_a_token_in_the_link_is_read_as_written_and_taken_off_the_address_bar(
    pages: Pages, served: Served
) -> None:
    """URLSearchParams read the "+" as a space (every call then got 401), and the token
    stayed in the address bar and the history."""
    page = pages.open(f"{served.url}/#token={LINK_TOKEN}")
    assert not page.is_visible("#auth"), "the link's token is taken"
    assert page.evaluate("location.href") == served.url + "/"
    call_live(page)
    assert len(live_calls(served, LINK_TOKEN)) == 1
    page.click("#hangup")
    wait_calls_empty(served, LINK_TOKEN)
    page.reload()
    page.wait_for_function("window.cadence && !document.getElementById('call').disabled")
    assert not page.is_visible("#auth"), "kept for the tab's session"


def test_a_page_without_microphone_access_says_why(pages: Pages, served: Served) -> None:
    """Over plain http to another host the browser has no navigator.mediaDevices: the page
    said only that the microphone could not be opened."""
    page = pages.new_page()
    page.add_init_script("Object.defineProperty(navigator, 'mediaDevices', {value: undefined})")
    page.goto(served.url)
    page.wait_for_function("window.cadence && !document.getElementById('call').disabled")
    page.click("#call")
    assert "needs https" in wait_notice(page, "mic-failed")
    assert live_calls(served) == []


def test_a_blocked_microphone_is_explained(
    browser: Browser, served: Served, tmp_path: Path
) -> None:
    wav = tone_bursts(tmp_path / "bursts.wav", seconds=2.0)
    denying = launch(browser.browser_type, wav, fake_mic_ui=False)  # getUserMedia is refused
    try:
        page = Pages(denying).open(served.url)
        page.click("#call")
        assert "Microphone blocked" in wait_notice(page, "mic-denied")
        assert page.evaluate("window.cadence.state") == "idle"
    finally:
        denying.close()
    assert live_calls(served) == []


def test_a_network_outage_is_shown_and_the_call_recovers(pages: Pages, served: Served) -> None:
    page = pages.open(served.url)
    call_live(page)
    gateway = child_pid(served, "gateway")
    os.kill(gateway, signal.SIGSTOP)  # no packets, no answers: to the browser, the network is gone
    try:
        text = wait_notice(page, "network-unstable", timeout_ms=30_000)
    finally:
        os.kill(gateway, signal.SIGCONT)
    assert "interrupted" in text
    page.wait_for_function("window.cadence.panel.values.connection === 'connected'", timeout=30_000)
    page.wait_for_selector("#notice", state="hidden", timeout=10_000)
    assert page.evaluate("window.cadence.state") == "live"
    page.click("#hangup")
    wait_calls_empty(served)


def test_with_a_tokenizer_the_page_opens_the_captions_channel(pages: Pages, tmp_path: Path) -> None:
    tokenizer = train_tiny_tokenizer(tmp_path)
    served = start_serve(tmp_path / "serve.log", f"--captions-tokenizer={tokenizer}")
    try:
        assert served.get("/v1/config")[1]["captions"] is True
        page = pages.open(served.url)
        assert page.get_attribute("#captions", "data-state") == "waiting"
        assert page.is_visible(".caption-waiting")
        call_live(page)
        call_id = page.evaluate("window.cadence.session.id")
        deadline = time.monotonic() + 20
        while (record := served.get(f"/v1/calls/{call_id}")[1])["captions"]["channel"] != "open":
            assert time.monotonic() < deadline, f"the captions channel did not open: {record}"
            time.sleep(0.2)
        # the echo model emits no tokens: the channel stays open and silent
        page.wait_for_function("window.cadence.panel.values.met >= 25", timeout=20_000)
        assert served.get(f"/v1/calls/{call_id}")[1]["captions"]["pieces"] == 0
        assert page.inner_text("#caption-text") == ""
        page.click("#hangup")
        wait_calls_empty(served)
    finally:
        stop_serve(served)


def test_without_captions_the_page_says_which_model_it_hears(pages: Pages, served: Served) -> None:
    assert served.get("/v1/config")[1]["model"] == "echo"
    page = pages.open(served.url)
    assert page.get_attribute("#captions", "data-state") == "unavailable"
    assert "runs the echo model" in page.inner_text("#caption-unavailable")


@pytest.mark.slow
def test_moshi_without_a_tokenizer_is_not_called_the_echo_model(
    pages: Pages, tmp_path: Path
) -> None:
    pytest.importorskip("torch")
    moshi = ("--model=moshi", "--config=tiny", "--random-weights=1", "--slots=1")
    served = start_serve(tmp_path / "serve.log", *moshi, timeout_s=120.0)
    try:
        assert served.get("/v1/config")[1]["model"] == "moshi"
        page = pages.open(served.url)
        text = page.inner_text("#caption-unavailable")
        assert "runs moshi without captions" in text
        assert "--captions-tokenizer" in text
        assert "echo" not in text
    finally:
        stop_serve(served)


@pytest.mark.slow
def test_a_tiny_moshi_model_writes_captions_on_the_page(pages: Pages, tmp_path: Path) -> None:
    """Text tokens from a real (tiny, random) Moshi step reach the page as caption text.

    Deadlines are not asserted: a random tiny model on a shared CPU may miss some, and the
    point here is the caption path: engine tokens -> ring -> captioner -> data channel -> page.
    """
    pytest.importorskip("torch")
    tokenizer = train_tiny_tokenizer(tmp_path)
    moshi = ("--model=moshi", "--config=tiny", "--random-weights=1", "--slots=1")
    served = start_serve(
        tmp_path / "serve.log", *moshi, f"--captions-tokenizer={tokenizer}", timeout_s=120.0
    )
    try:
        page = pages.open(served.url)
        call_live(page)
        page.wait_for_function(
            "document.getElementById('caption-text').textContent.trim().length >= 20",
            timeout=30_000,
        )
        assert page.get_attribute("#captions", "data-state") == "live"
        call_id = page.evaluate("window.cadence.session.id")
        captions = served.get(f"/v1/calls/{call_id}")[1]["captions"]
        assert captions["channel"] == "open"
        assert captions["pieces"] > 0
        text = page.inner_text("#caption-text")
        assert set(text) <= set("abcdefghijklmnopqrstuvwxyz "), text  # pieces, no ids or ▁
        page.wait_for_function("window.cadence.panel.values.duration >= 3", timeout=20_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "demo-captions.png"))
        page.click("#hangup")
        wait_calls_empty(served)
    finally:
        stop_serve(served)
