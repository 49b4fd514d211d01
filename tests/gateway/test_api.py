"""The gateway's HTTP API against a real `cadence serve`: errors are clear, never a crash."""

import asyncio
import json
import os
import signal
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from aiortc import RTCPeerConnection

from gateway.app import MAX_BODY_BYTES, json_errors
from gateway.ice import restrict_host_candidates
from tests.support.caller import band_limited_noise, place_call
from tests.support.server import Served, children_of, http_json, start_serve, stop_serve


@pytest.fixture(scope="module")
def one_slot(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    restrict_host_candidates(["127.0.0.1"])
    served = start_serve(tmp_path_factory.mktemp("api") / "serve.log", "--slots=1")
    yield served
    stop_serve(served)


def _post(served: Served, body: object) -> tuple[int, object]:
    return http_json("POST", served.url + "/v1/calls", body)


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"type": "offer"}, "bad_request"),
        ({"sdp": 5}, "bad_request"),
        ({"sdp": "v=0", "type": "answer"}, "bad_request"),
        ({"sdp": "hello"}, "bad_offer"),
        (
            {"sdp": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=video 9 RTP 96\r\n"},
            "bad_offer",
        ),
        ({"sdp": "m=audio\nfoo"}, "bad_offer"),  # an AssertionError inside aiortc's parser
        ([[[[[]]]]] * 3, "bad_request"),
    ],
)
def test_bad_offers_get_400_with_a_reason(one_slot: Served, body: object, code: str) -> None:
    status, reply = _post(one_slot, body)
    assert status == 400
    assert isinstance(reply, dict)
    assert reply["error"] == code
    assert reply["detail"]


def test_offers_aiortc_parses_but_cannot_answer_get_400(one_slot: Served) -> None:
    """They failed inside aiortc's answer with AttributeError: a 500 and a traceback."""

    async def two_audio_sections() -> str:
        browser = RTCPeerConnection()
        browser.addTransceiver("audio", direction="sendrecv")
        browser.addTransceiver("audio", direction="sendrecv")
        await browser.setLocalDescription(await browser.createOffer())
        sdp: str = browser.localDescription.sdp
        await browser.close()
        return sdp

    sdp = asyncio.run(two_audio_sections())
    assert "a=mid:1" in sdp
    for broken in (
        sdp.replace("a=mid:1", "a=mid:0"),  # two m-lines, one mid
        sdp.replace("a=group:BUNDLE 0 1", "a=group:BUNDLE x 0 1"),  # a group naming no m-line
    ):
        assert broken != sdp
        status, reply = _post(one_slot, {"sdp": broken, "type": "offer"})
        assert isinstance(reply, dict)
        assert (status, reply["error"]) == (400, "bad_offer"), reply


def test_a_charset_python_has_no_codec_for_gets_400(one_slot: Served) -> None:
    request = urllib.request.Request(
        one_slot.url + "/v1/calls",
        data=b'{"sdp": "v=0"}',
        headers={"Content-Type": "application/json; charset=bogus"},
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"] == "bad_request"


def test_json_nested_past_the_parsers_depth_gets_400(one_slot: Served) -> None:
    body = b"[" * 20_000 + b"]" * 20_000  # well inside the size limit
    request = urllib.request.Request(one_slot.url + "/v1/calls", data=body, method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["error"] == "bad_request"


def test_unknown_calls_are_404(one_slot: Served) -> None:
    assert one_slot.get("/v1/calls/nope")[0] == 404
    assert http_json("DELETE", one_slot.url + "/v1/calls/nope")[0] == 404


def test_the_apis_own_refusals_by_aiohttp_are_json_errors_too(one_slot: Served) -> None:
    status, reply = _post(one_slot, {"sdp": "x" * (MAX_BODY_BYTES + 1)})
    assert isinstance(reply, dict)
    assert (status, reply["error"]) == (413, "body_too_large")
    assert str(MAX_BODY_BYTES) in reply["detail"]
    status, reply = http_json("GET", one_slot.url + "/v1/nothing-here")
    assert (status, reply["error"]) == (404, "not_found")
    request = urllib.request.Request(one_slot.url + "/v1/calls", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 405
    assert "POST" in refused.value.headers["Allow"]
    assert json.loads(refused.value.read())["error"] == "method_not_allowed"


def test_a_full_engine_answers_503_with_retry_after(one_slot: Served) -> None:
    async def scenario() -> tuple[int, str | None]:
        talk = asyncio.create_task(place_call(one_slot.url, band_limited_noise(3.0), 2.0))
        await asyncio.sleep(1.0)  # the first call holds the only slot
        req = urllib.request.Request(
            one_slot.url + "/v1/calls",
            data=b'{"sdp": "v=0\\r\\nm=audio 9 UDP/TLS/RTP/SAVPF 111\\r\\n"}',
            method="POST",
        )
        try:
            urllib.request.urlopen(req, timeout=5)
            result: tuple[int, str | None] = (201, None)
        except urllib.error.HTTPError as e:
            result = (e.code, e.headers.get("Retry-After"))
        await talk
        return result

    status, retry_after = asyncio.run(scenario())
    assert status == 503
    assert retry_after is not None
    assert int(retry_after) > 0
    metrics = one_slot.engine_metrics()
    assert metrics['cadence_engine_admissions_total{outcome="full"}'] >= 1


def test_an_offer_whose_browser_never_connects_gives_its_slot_back(tmp_path: Path) -> None:
    served = start_serve(tmp_path / "serve.log", "--slots=1", "--webrtc-setup-timeout-s=1")
    try:

        async def abandon() -> str:
            pc = RTCPeerConnection()
            pc.addTransceiver("audio", direction="sendrecv")
            await pc.setLocalDescription(await pc.createOffer())
            offer = {"sdp": pc.localDescription.sdp, "type": "offer"}
            loop = asyncio.get_running_loop()
            status, body = await loop.run_in_executor(
                None, http_json, "POST", served.url + "/v1/calls", offer
            )
            assert status == 201, body
            await pc.close()  # the tab closes before its connection comes up
            return str(body["id"])

        call_id = asyncio.run(abandon())
        deadline = time.monotonic() + 10.0
        while (answer := served.get(f"/v1/calls/{call_id}"))[0] == 200:
            assert answer[1]["state"] == "connecting"
            assert time.monotonic() < deadline, "the abandoned call kept its slot"
            time.sleep(0.1)
        status, body = answer
        assert status == 410
        assert body["call"]["end_reason"] == "setup_timeout"
        result = asyncio.run(place_call(served.url, band_limited_noise(2.0), 1.0))
        assert result.record["state"] == "live", "the one slot was free again"
    finally:
        stop_serve(served)


def test_healthz_reports_the_engine(one_slot: Served) -> None:
    status, body = one_slot.get("/healthz")
    assert status == 200
    assert isinstance(body, dict)
    assert body["engine"] == "ready"
    assert body["slots"] == 1


def test_a_dead_engine_is_reported_then_restarted(tmp_path: Path) -> None:
    served = start_serve(tmp_path / "serve.log")
    try:
        (engine,) = [
            pid
            for pid in children_of(served.process.pid)
            if b"engine" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        ]
        os.kill(engine, signal.SIGKILL)
        # the gateway's watch notices within a second or two; under load healthz's 503 window
        # can close (the new engine is up) between two polls, the gateway's log line cannot
        deadline = time.monotonic() + 30
        while "engine is down" not in served.log():
            assert time.monotonic() < deadline, "the gateway never noticed the engine was gone"
            time.sleep(0.05)
        deadline = time.monotonic() + 30
        while served.get("/healthz")[0] != 200:
            assert time.monotonic() < deadline, "the engine was not restarted and re-attached"
            time.sleep(0.1)
        result = asyncio.run(place_call(served.url, band_limited_noise(2.0), 1.5))
        engine_record = result.record["engine"]
        assert isinstance(engine_record, dict)
        assert engine_record["ticks"] > 5, "the new engine serves calls"
        assert not any(
            name.endswith("-1")
            for name in os.listdir("/dev/shm")
            if name.startswith(f"cadence-{served.process.pid}-")
        ), "the killed engine's shared memory was removed"
    finally:
        assert stop_serve(served) == 0


def test_a_bug_under_the_api_is_a_json_500_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    """The API's error contract holds for a failure nobody foresaw (aiohttp's own answer is
    a text page); the page outside /v1/ keeps aiohttp's handling."""

    async def failing(request: web.Request) -> web.Response:
        raise KeyError("a bug")

    async def scenario() -> list[tuple[int, str]]:
        app = web.Application(middlewares=[json_errors])
        app.router.add_get("/v1/broken", failing)
        app.router.add_get("/broken", failing)
        async with TestClient(TestServer(app)) as client:
            answers = []
            for path in ("/v1/broken", "/broken"):
                response = await client.get(path)
                answers.append((response.status, response.content_type))
                if path.startswith("/v1/"):
                    assert (await response.json())["error"] == "internal_error"
            return answers

    with caplog.at_level("ERROR", logger="gateway.app"):
        answers = asyncio.run(scenario())
    assert answers == [(500, "application/json"), (500, "text/plain")]
    assert any("GET /v1/broken failed" in r.getMessage() for r in caplog.records)
