"""The SIP part of the gateway's config and CLI: off by default, bad values refused early."""

from pathlib import Path
from typing import Any

import pytest

from cadence.cli import _gateway_argv, _host_port, _port_range, build_parser
from gateway.config import GatewayConfig

SOCKET = Path("/tmp/engine.sock")


def test_sip_is_off_unless_asked_for() -> None:
    assert GatewayConfig(SOCKET).sip_port == 0
    args = build_parser().parse_args(["serve"])
    assert "--sip-port=0" in _gateway_argv(args)


def test_serve_passes_every_sip_flag_to_its_gateway() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--sip-port=5070",
            "--sip-allow=10.0.0.0/8",
            "--sip-allow=192.0.2.7",
            "--rtp-ports=30000-30100",
            "--sip-busy=486",
            "--rtp-timeout-s=5",
            "--sip-ring-ms=250",
            "--sip-proxy=pbx.example:5070",
        ]
    )
    argv = _gateway_argv(args)
    gateway = build_parser().parse_args(["gateway", "--engine-control=/tmp/e.sock", *argv])
    assert (gateway.sip_port, gateway.sip_allow) == (5070, ["10.0.0.0/8", "192.0.2.7"])
    assert (gateway.rtp_ports, gateway.sip_busy) == ("30000-30100", 486)
    assert (gateway.rtp_timeout_s, gateway.sip_ring_ms) == (5.0, 250.0)
    assert _port_range(gateway.rtp_ports) == (30000, 30100)
    assert _host_port(gateway.sip_proxy) == ("pbx.example", 5070)
    assert _host_port("pbx.example") == ("pbx.example", 5060)


@pytest.mark.parametrize(
    ("text", "host_port"),
    [
        ("2001:db8::1", ("2001:db8::1", 5060)),
        ("[2001:db8::1]", ("2001:db8::1", 5060)),
        ("[2001:db8::1]:5070", ("2001:db8::1", 5070)),
        ("192.0.2.7:5080", ("192.0.2.7", 5080)),
    ],
)
def test_the_proxy_address_may_be_ipv6(text: str, host_port: tuple[str, int]) -> None:
    assert _host_port(text) == host_port


@pytest.mark.parametrize("text", ["[2001:db8::1", "[2001:db8::1]5070", "[2001:db8::1]:x"])
def test_a_malformed_bracketed_proxy_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="--sip-proxy"):
        _host_port(text)


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("sip_port", 70000, "SIP port"),
        ("sip_address", "0.0.0.0", "concrete address"),
        ("sip_address", "pbx.example", "IP address"),
        ("rtp_ports", (20000, 20001), "RTP port range"),
        ("rtp_ports", (80, 2000), "RTP port range"),
        ("sip_allow", ("10.0.0.0/33",), "CIDR"),
        ("rtp_timeout_s", 0.0, "RTP timeout"),
        ("sip_busy_status", 480, "busy status"),
        ("sip_ring_s", -1.0, "ring time"),
        ("sip_register", "alice@example.com", "not a sip: URI"),
        ("sip_register", "sip:alice@example.com", "needs SIP"),
        ("sip_proxy", ("", 5060), "SIP proxy"),
    ],
)
def test_bad_sip_settings_are_refused(field: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatewayConfig(SOCKET, **{field: value})


def test_a_port_range_needs_a_dash() -> None:
    with pytest.raises(ValueError, match="LOW-HIGH"):
        _port_range("20000")
