"""SIPp against a real `cadence serve --sip-port`: audio through the engine, DTMF, hang-ups,
hold, refusals, and load. Every SIPp run must exit 0 and leave no call, slot or dialog behind.
"""

from __future__ import annotations

import itertools
import logging
import random
import socket
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from gateway.rtp.g711 import ulaw_encode
from gateway.rtp.session import RtpSender
from tests.sip.peer import PAYLOAD_TYPES, RtpPeer, band_limited_noise, echo_delay
from tests.sip.sipp import Sipp, run_sipp, start_sipp
from tests.support.server import Served, free_port, http_json, start_serve, stop_serve

log = logging.getLogger(__name__)

MAX_SERVER_DELAY_S = 0.35  # jitter buffer + framing + one echo tick + pacing, with slack
CODECS = {"PCMU": "0", "PCMA": "8"}
CONCURRENT = 50
MIN_CORRELATION = 0.95  # echo vs sent, sub-sample aligned: G.711 twice and two resamplers
RTP_TIMEOUT_S = 3.0
RING_S = 0.3  # admitted (a slot and a call record), then 180 Ringing this long before 200 OK


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Served, int]]:
    sip_port = free_port()
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    served = start_serve(
        log_path,
        "--slots=56",
        f"--sip-port={sip_port}",
        "--rtp-ports=41000-41999",
        f"--sip-ring-ms={round(RING_S * 1000)}",
        f"--rtp-timeout-s={RTP_TIMEOUT_S}",
    )
    yield served, sip_port
    if served.process.poll() is None:
        stop_serve(served)


def _idle(served: Served) -> None:
    """No call left in the gateway, no SIP dialog in its agent, no slot in the engine."""
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        _, calls = served.get("/v1/calls")
        _, health = served.get("/healthz")
        if calls == {"calls": []} and health["sip_dialogs"] == 0 and health["slots_live"] == 0:
            return
        time.sleep(0.1)
    raise AssertionError(f"left behind: {calls}, {health}")


def _call_keys(peer: RtpPeer) -> dict[str, str]:
    return {
        "media_addr": "127.0.0.1",
        "rtp_port": str(peer.port),
        "codec": CODECS[peer.codec],
        "codec_name": peer.codec,
        "ptime": str(peer.ptime_ms),
    }


def _live_call(served: Served) -> dict[str, Any]:
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        _, body = served.get("/v1/calls")
        if body["calls"]:
            call: dict[str, Any] = body["calls"][0]
            return call
        time.sleep(0.05)
    raise AssertionError("no call showed up")


@pytest.mark.parametrize(
    ("codec", "ptime_ms"),
    [("PCMU", 20), ("PCMA", 30), ("PCMA", 20), ("PCMU", 30), ("PCMU", 10), ("PCMA", 60)],
)
def test_audio_comes_back_through_the_engine(
    served: tuple[Served, int], tmp_path: Path, codec: str, ptime_ms: int
) -> None:
    server, sip_port = served
    peer = RtpPeer(codec, ptime_ms, band_limited_noise(6.0))
    try:
        sipp = start_sipp(tmp_path, "call.xml", sip_port, duration_ms=6000, keys=_call_keys(peer))
        time.sleep(4.0)
        record = _live_call(server)
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
    peak, delay_s = echo_delay(peer)
    log.info(
        "%s %d ms: correlation %.3f, server-side delay %.1f ms; jitter %s; rtp %s",
        codec,
        ptime_ms,
        peak,
        delay_s * 1e3,
        record["jitter_buffer"],
        record["sip"]["rtp"],
    )
    assert record["transport"] == "sip"
    assert record["sip"]["codec"] == codec
    assert record["sip"]["ptime_ms"] == ptime_ms
    assert record["engine"]["misses"] == 0
    assert peak > MIN_CORRELATION, f"returned audio does not match what was sent (peak {peak:.3f})"
    assert 0.08 < delay_s < MAX_SERVER_DELAY_S, f"server-side delay {delay_s * 1e3:.0f} ms"
    n = ptime_ms * 8
    assert {len(h.payload) for h in peer.heard} == {n}, "packets of the negotiated ptime"
    assert all((b.timestamp - a.timestamp) % n == 0 for a, b in itertools.pairwise(peer.heard))
    _idle(server)


def _final_record(served: Served, call_id: str) -> dict[str, Any]:
    status, body = served.get(f"/v1/calls/{call_id}")
    assert status == 410, body
    record: dict[str, Any] = body["call"]
    return record


def test_dtmf_digits_reach_the_call_record(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    sipp = start_sipp(tmp_path, "dtmf.xml", sip_port, duration_ms=3000)
    call_id = _live_call(server)["id"]
    assert sipp.wait(30) == 0, sipp.errors()
    record = _final_record(server, call_id)
    assert record["dtmf"] == "123#"
    assert record["sip"]["telephone_event"] == 96
    assert record["end_reason"] == "peer_hangup"
    _idle(server)


def test_cancel_before_answer(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    sipp = run_sipp(tmp_path, "cancel.xml", sip_port)
    assert sipp.process.returncode == 0, sipp.errors()
    _idle(server)


def test_api_hangup_sends_bye(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMU", 20, band_limited_noise(1.0))
    try:
        sipp = start_sipp(tmp_path, "server_bye.xml", sip_port, keys=_call_keys(peer))
        call_id = _live_call(server)["id"]
        time.sleep(1.0)
        status, record = http_json("DELETE", f"{server.url}/v1/calls/{call_id}")
        assert status == 200
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
    assert record["end_reason"] == "hangup"
    _idle(server)


def test_silent_peer_is_hung_up(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMU", 20, band_limited_noise(1.0), mute=True)
    try:
        sipp = start_sipp(tmp_path, "server_bye.xml", sip_port, keys=_call_keys(peer))
        call_id = _live_call(server)["id"]
        assert sipp.wait(30) == 0, sipp.errors()  # it got the gateway's BYE
    finally:
        peer.stop()
    record = _final_record(server, call_id)
    assert record["end_reason"] == "rtp_timeout"
    assert RTP_TIMEOUT_S <= record["duration_s"] < RTP_TIMEOUT_S + 2.0
    _idle(server)


def test_hold_stops_sending_and_resume_restarts(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMU", 20, band_limited_noise(1.0))
    try:
        sipp = start_sipp(tmp_path, "hold.xml", sip_port, duration_ms=2000, keys=_call_keys(peer))
        call_id = _live_call(server)["id"]
        states = []
        deadline = time.monotonic() + 8.0
        while sipp.process.poll() is None and time.monotonic() < deadline:
            _, body = server.get("/v1/calls")
            states += [c["state"] for c in body["calls"]]
            time.sleep(0.1)
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
    assert "held" in states
    assert states[-1] == "live"
    record = _final_record(server, call_id)
    # the engine kept ticking the slot through the hold
    assert record["engine"]["ticks"] >= 0.9 * record["duration_s"] / 0.08
    assert record["sip"]["rtp"]["held"] >= 1.5 / 0.02
    arrivals = [h.arrival_s for h in peer.heard]
    longest_gap = max(b - a for a, b in itertools.pairwise(arrivals))
    assert 1.5 < longest_gap < 2.6, f"no silence while held: longest gap {longest_gap:.2f} s"
    _idle(server)


def test_a_reinvite_moves_the_media_to_a_new_port_and_codec(
    served: tuple[Served, int], tmp_path: Path
) -> None:
    server, sip_port = served
    # the first media only listens (under the 3 s RTP timeout), so the move is what makes sound
    first = RtpPeer("PCMA", 20, band_limited_noise(0.5), mute=True)
    moved = RtpPeer("PCMU", 20, band_limited_noise(1.5))  # where the re-INVITE moves it
    keys = {
        **_call_keys(first),
        "rtp_port_b": str(moved.port),
        "codec_b": CODECS["PCMU"],
        "codec_name_b": "PCMU",
    }
    try:
        sipp = start_sipp(tmp_path, "move.xml", sip_port, duration_ms=2000, keys=keys)
        call_id = _live_call(server)["id"]
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        first.stop()
        moved.stop()
    assert {h.payload_type for h in first.heard} == {PAYLOAD_TYPES["PCMA"]}
    assert {h.payload_type for h in moved.heard} == {PAYLOAD_TYPES["PCMU"]}, "sent on, in PCMU"
    peak, _ = echo_delay(moved)  # what the new media sent came back to it
    assert peak > MIN_CORRELATION
    record = _final_record(server, call_id)
    assert record["sip"]["codec"] == "PCMU"
    _idle(server)


def test_fifty_concurrent_calls_meet_every_deadline(
    served: tuple[Served, int], tmp_path: Path
) -> None:
    server, sip_port = served
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "audio.pcmu").write_bytes(ulaw_encode(band_limited_noise(1.0)))
    before = server.engine_metrics()
    sipp = start_sipp(
        tmp_path,
        "load.xml",
        sip_port,
        calls=CONCURRENT,
        duration_ms=5000,
        extra=("-l", str(CONCURRENT), "-r", "25"),
    )
    peak, snapshot = 0, list[dict[str, Any]]()
    while sipp.process.poll() is None:
        _, health = server.get("/healthz")  # cheap: GET /v1/calls would cost the pump CPU
        peak = max(peak, health["calls"])
        if peak == CONCURRENT and not snapshot:
            # one look at every call's record once the newest has rung and had a second of
            # media: counted from admission alone, its window is 0.7 s, less the server's delay
            time.sleep(RING_S + 1.0)
            snapshot = server.get("/v1/calls")[1]["calls"]
        time.sleep(0.2)
    assert sipp.wait(60) == 0, sipp.errors()
    assert len(snapshot) == CONCURRENT
    for record in snapshot:  # media flowed both ways on every call, even the newest
        assert record["sip"]["rtp"]["received"] >= 0.5 / 0.02, record
        assert record["sip"]["rtp"]["sent"] >= 0.5 / 0.02, record
        assert record["downlink"]["frames"] > 0, record
    after = server.engine_metrics()
    misses = "cadence_engine_deadline_misses_total"
    ticks = "cadence_engine_call_ticks_total"
    log.info(
        "%d calls (peak %d live): %d call-ticks, %d deadline misses",
        CONCURRENT,
        peak,
        after[ticks] - before[ticks],
        after[misses] - before[misses],
    )
    assert peak == CONCURRENT
    assert after[misses] == before[misses]
    assert after[ticks] - before[ticks] >= CONCURRENT * 4.0 / 0.08
    played = _gateway_counter(
        server, 'cadence_gateway_packets_total{outcome="played",transport="sip"}'
    )
    assert played >= CONCURRENT * 4.0 / 0.02, "SIPp's RTP reached the jitter buffers"
    _idle(server)


def _gateway_counter(served: Served, series: str) -> float:
    with urllib.request.urlopen(f"{served.url}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(series + " "):
                return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{series} not exported")


def test_full_engine_answers_503_and_stopping_says_bye(tmp_path: Path) -> None:
    sip_port = free_port()
    server = start_serve(
        tmp_path / "serve.log", "--slots=1", f"--sip-port={sip_port}", "--rtp-ports=42000-42099"
    )
    peer = RtpPeer("PCMA", 20, band_limited_noise(1.0))
    try:
        holder = start_sipp(tmp_path / "holder", "server_bye.xml", sip_port, keys=_call_keys(peer))
        _live_call(server)
        refused = run_sipp(tmp_path / "refused", "busy.xml", sip_port)
        assert refused.process.returncode == 0, refused.errors()
        full = 'cadence_gateway_admission_refusals_total{reason="full"}'
        assert _gateway_counter(server, full) == 1
        assert stop_serve(server) == 0
        assert holder.wait(30) == 0, holder.errors()  # the gateway said BYE on its way out
    finally:
        peer.stop()
        if server.process.poll() is None:
            stop_serve(server)


def test_call_over_tcp(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMU", 20, band_limited_noise(3.0))
    try:
        sipp = run_sipp(
            tmp_path,
            "call.xml",
            sip_port,
            duration_ms=3000,
            keys=_call_keys(peer),
            extra=("-t", "t1"),
        )
        assert sipp.process.returncode == 0, sipp.errors()
    finally:
        peer.stop()
    peak, _ = echo_delay(peer)
    assert peak > MIN_CORRELATION
    _idle(server)


@pytest.mark.parametrize("scenario", ["uas.xml", "uas_auth.xml"])
def test_outbound_call_through_the_api(
    served: tuple[Served, int], tmp_path: Path, scenario: str
) -> None:
    server, _ = served
    peer = RtpPeer("PCMA", 20, band_limited_noise(5.0))
    callee_port = free_port()
    try:
        sipp = start_sipp(tmp_path, scenario, None, local_port=callee_port, keys=_call_keys(peer))
        request = {"uri": f"sip:echo@127.0.0.1:{callee_port}"}
        if scenario == "uas_auth.xml":
            request.update(username="alice", password="secret")
        status, body = http_json("POST", f"{server.url}/v1/calls/sip", request)
        assert status == 201, body
        time.sleep(5.0)
        _, record = server.get(f"/v1/calls/{body['id']}")
        status, _ = http_json("DELETE", f"{server.url}/v1/calls/{body['id']}")
        assert status == 200
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
    assert record["state"] == "live"
    assert record["sip"]["outbound"] is True
    assert record["sip"]["codec"] == "PCMA"
    peak, delay_s = echo_delay(peer)
    log.info("outbound: correlation %.3f, server-side delay %.1f ms", peak, delay_s * 1e3)
    assert peak > MIN_CORRELATION
    _idle(server)


def test_a_call_through_the_trunk_authenticates_with_the_trunk_credentials(
    tmp_path: Path,
) -> None:
    trunk_port = free_port()
    peer = RtpPeer("PCMA", 20, band_limited_noise(3.0))
    server = start_serve(
        tmp_path / "serve.log",
        "--slots=1",
        f"--sip-port={free_port()}",
        "--rtp-ports=42200-42299",
        "--sip-username=alice",
        "--sip-password=secret",
        f"--sip-proxy=127.0.0.1:{trunk_port}",
    )
    try:
        trunk = start_sipp(
            tmp_path / "trunk", "uas_auth.xml", None, local_port=trunk_port, keys=_call_keys(peer)
        )
        request = {"uri": "sip:echo@pbx.invalid"}  # no credentials of its own
        status, body = http_json("POST", f"{server.url}/v1/calls/sip", request)
        assert status == 201, body
        time.sleep(3.0)
        _, record = server.get(f"/v1/calls/{body['id']}")
        assert http_json("DELETE", f"{server.url}/v1/calls/{body['id']}")[0] == 200
        assert trunk.wait(30) == 0, trunk.errors()  # its digest challenge was answered
        assert record["state"] == "live"
    finally:
        peer.stop()
        if server.process.poll() is None:
            stop_serve(server)


def _ended(served: Served, call_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 10.0
    while time.monotonic() < deadline:
        status, body = served.get(f"/v1/calls/{call_id}")
        if status == 410:
            record: dict[str, Any] = body["call"]
            return record
        time.sleep(0.1)
    raise AssertionError(f"call {call_id} did not end")


def test_outbound_call_to_a_busy_callee(served: tuple[Served, int], tmp_path: Path) -> None:
    server, _ = served
    callee_port = free_port()
    sipp = start_sipp(tmp_path, "uas_busy.xml", None, local_port=callee_port)
    status, body = http_json(
        "POST", f"{server.url}/v1/calls/sip", {"uri": f"sip:echo@127.0.0.1:{callee_port}"}
    )
    assert status == 201, body
    record = _ended(server, body["id"])
    assert sipp.wait(30) == 0, sipp.errors()
    assert record["end_reason"] == "rejected"
    assert record["sip"]["status"] == 486
    _idle(server)


def test_outbound_hangup_while_ringing_cancels(served: tuple[Served, int], tmp_path: Path) -> None:
    server, _ = served
    callee_port = free_port()
    sipp = start_sipp(tmp_path, "uas_cancel.xml", None, local_port=callee_port)
    status, body = http_json(
        "POST", f"{server.url}/v1/calls/sip", {"uri": f"sip:echo@127.0.0.1:{callee_port}"}
    )
    assert status == 201, body
    deadline = time.monotonic() + 5.0
    while server.get(f"/v1/calls/{body['id']}")[1]["state"] != "ringing":
        assert time.monotonic() < deadline, "the callee never rang"
        time.sleep(0.05)
    assert http_json("DELETE", f"{server.url}/v1/calls/{body['id']}")[0] == 200
    assert sipp.wait(30) == 0, sipp.errors()  # it saw our CANCEL and its 487 was acknowledged
    _idle(server)


def test_a_dial_with_no_free_rtp_port_is_503_not_a_bad_uri(tmp_path: Path) -> None:
    server = start_serve(
        tmp_path / "serve.log", "--slots=4", f"--sip-port={free_port()}", "--rtp-ports=43000-43002"
    )
    try:
        silent = {"uri": f"sip:nobody@127.0.0.1:{free_port()}"}  # INVITEs go unanswered
        status, first = http_json("POST", f"{server.url}/v1/calls/sip", silent)
        assert status == 201, first  # dialling, on the range's one RTP port
        status, refused = http_json("POST", f"{server.url}/v1/calls/sip", silent)
        assert status == 503, refused
        assert refused["error"] == "dial_unavailable"
        assert "exhausted" in refused["detail"]
        assert http_json("DELETE", f"{server.url}/v1/calls/{first['id']}")[0] == 200
        # the call, its slot and its port are given back at once; its INVITE transaction
        # lives on until timer B (32 s): no CANCEL may go before a provisional response
        _, health = server.get("/healthz")
        assert (health["calls"], health["slots_live"], health["rtp_ports_free"]) == (0, 0, 1)
    finally:
        stop_serve(server)


def test_late_offer_is_answered_in_the_ack(served: tuple[Served, int], tmp_path: Path) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMA", 20, band_limited_noise(4.0))
    try:
        sipp = start_sipp(
            tmp_path, "late_offer.xml", sip_port, duration_ms=4000, keys=_call_keys(peer)
        )
        time.sleep(2.0)
        record = _live_call(server)
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
    assert record["sip"]["codec"] == "PCMA"  # from the answer in the ACK
    peak, _ = echo_delay(peer)
    assert peak > MIN_CORRELATION
    _idle(server)


def _until_registered(server: Served, registrar: Sipp) -> None:
    """Wait (10 s at most) for the gateway's /healthz to show the binding; the registrar
    (or the proxy before it) must not have ended meanwhile."""
    deadline = time.monotonic() + 10.0
    while server.get("/healthz")[1].get("sip_registration") != "registered":
        assert registrar.process.poll() is None, registrar.errors()
        assert time.monotonic() < deadline, server.get("/healthz")
        time.sleep(0.1)


def test_registers_and_dials_through_the_trunk(tmp_path: Path) -> None:
    registrar_port, trunk_port = free_port(), free_port()
    registrar = start_sipp(tmp_path / "registrar", "registrar.xml", None, local_port=registrar_port)
    trunk = start_sipp(tmp_path / "trunk", "uas_trunk.xml", None, local_port=trunk_port)
    server = start_serve(
        tmp_path / "serve.log",
        "--slots=1",
        f"--sip-port={free_port()}",
        "--rtp-ports=42100-42199",
        "--sip-register=sip:alice@cadence.example",
        # named, the registrar gets the REGISTER directly, not through the trunk
        f"--sip-registrar=sip:127.0.0.1:{registrar_port}",
        "--sip-username=alice",
        "--sip-password=secret",
        f"--sip-proxy=127.0.0.1:{trunk_port}",
    )
    try:
        _until_registered(server, registrar)
        request = {"uri": "sip:bob@pbx.invalid", "from": "sip:+4930123@cadence.example"}
        status, body = http_json("POST", f"{server.url}/v1/calls/sip", request)
        assert status == 201, body
        record = _ended(server, body["id"])
        assert trunk.wait(30) == 0, trunk.errors()  # the INVITE went to the trunk, From intact
        assert record["sip"]["status"] == 486
        assert stop_serve(server) == 0
        assert registrar.wait(30) == 0, registrar.errors()  # Expires: 0 arrived
    finally:
        if server.process.poll() is None:
            stop_serve(server)


def test_registers_through_the_outbound_proxy_when_no_registrar_is_named(
    tmp_path: Path,
) -> None:
    """The address-of-record's domain does not resolve; the trunk given as --sip-proxy is the
    only way to the registrar, and gets the binding and its removal."""
    proxy_port = free_port()
    proxy = start_sipp(tmp_path / "proxy", "registrar.xml", None, local_port=proxy_port)
    server = start_serve(
        tmp_path / "serve.log",
        "--slots=1",
        f"--sip-port={free_port()}",
        "--rtp-ports=42200-42299",
        "--sip-register=sip:alice@trunk.invalid",
        "--sip-username=alice",
        "--sip-password=secret",
        f"--sip-proxy=127.0.0.1:{proxy_port}",
    )
    try:
        _until_registered(server, proxy)
        assert stop_serve(server) == 0
        assert proxy.wait(30) == 0, proxy.errors()  # Expires: 0 arrived there too
    finally:
        if server.process.poll() is None:
            stop_serve(server)


def test_registers_through_a_challenging_proxy_answering_both_challenges(
    tmp_path: Path,
) -> None:
    """407 from the proxy, then 401 from the registrar: the third REGISTER carries both the
    Proxy-Authorization (nonce count 2) and the Authorization, or SIPp fails it."""
    registrar_port = free_port()
    registrar = start_sipp(
        tmp_path / "registrar", "registrar_proxy_auth.xml", None, local_port=registrar_port
    )
    server = start_serve(
        tmp_path / "serve.log",
        "--slots=1",
        f"--sip-port={free_port()}",
        "--rtp-ports=42300-42399",
        f"--sip-register=sip:alice@127.0.0.1:{registrar_port}",
        "--sip-username=alice",
        "--sip-password=secret",
    )
    try:
        _until_registered(server, registrar)
        assert stop_serve(server) == 0
        assert registrar.wait(30) == 0, registrar.errors()  # Expires: 0 arrived
    finally:
        if server.process.poll() is None:
            stop_serve(server)


def test_sources_outside_the_allow_list_get_403(tmp_path: Path) -> None:
    sip_port = free_port()
    server = start_serve(
        tmp_path / "serve.log",
        "--slots=1",
        f"--sip-port={sip_port}",
        "--rtp-ports=42200-42299",
        "--sip-allow=192.0.2.0/24",
    )
    try:
        sipp = run_sipp(tmp_path / "sipp", "forbidden.xml", sip_port)
        assert sipp.process.returncode == 0, sipp.errors()
        _idle(server)
    finally:
        stop_serve(server)


def test_a_third_party_cannot_inject_or_steal_rtp(
    served: tuple[Served, int], tmp_path: Path
) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMU", 20, band_limited_noise(4.0))
    intruder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    intruder.bind(("127.0.0.1", 0))
    intruder.settimeout(0.5)
    try:
        sipp = start_sipp(tmp_path, "call.xml", sip_port, duration_ms=4000, keys=_call_keys(peer))
        call_id = _live_call(server)["id"]
        time.sleep(1.0)
        assert peer.gateway is not None
        sender = RtpSender(0, random.Random(9))
        loud = ulaw_encode(np.full(160, 20000, np.int16))
        for _ in range(50):
            intruder.sendto(sender.audio(loud, 160), peer.gateway)
            time.sleep(0.02)
        with pytest.raises(TimeoutError):
            intruder.recvfrom(2048)  # nothing was redirected to the intruder
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
        intruder.close()
    record = _final_record(server, call_id)
    assert record["sip"]["rtp"]["ignored"] >= 50
    assert record["sip"]["rtp"]["latched"] == 0  # the peer sent from its SDP address
    peak, _ = echo_delay(peer)
    assert peak > MIN_CORRELATION
    _idle(server)


def test_lost_packets_are_concealed_without_lasting_delay(
    served: tuple[Served, int], tmp_path: Path
) -> None:
    server, sip_port = served
    peer = RtpPeer("PCMU", 20, band_limited_noise(6.0), lose_every=25)  # 4% loss
    try:
        sipp = start_sipp(tmp_path, "call.xml", sip_port, duration_ms=6000, keys=_call_keys(peer))
        call_id = _live_call(server)["id"]
        assert sipp.wait(30) == 0, sipp.errors()
    finally:
        peer.stop()
    record = _final_record(server, call_id)
    jitter = record["jitter_buffer"]
    assert jitter["lost"] >= 8
    assert jitter["concealed"] >= jitter["lost"]
    peak, delay_s = echo_delay(peer)
    log.info("4%% loss: correlation %.3f, delay %.1f ms, %s", peak, delay_s * 1e3, jitter)
    assert peak > 0.9  # windows with a concealed packet correlate less
    assert delay_s < MAX_SERVER_DELAY_S
    _idle(server)
