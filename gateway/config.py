"""The gateway process's one typed configuration, validated when built."""

import ipaddress
from dataclasses import dataclass, field
from pathlib import Path

from gateway.media.jitter import JitterConfig

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"
ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")
MIN_TOKEN_CHARS = 16  # a guessable bearer token protects nothing
SIP_BUSY_STATUSES = (503, 486)  # 503 + Retry-After: try later or elsewhere; 486: busy here


@dataclass(frozen=True)
class GatewayConfig:
    engine_control: Path  # the engine's admission socket
    host: str = "127.0.0.1"
    port: int = 8080
    web_root: Path = WEB_ROOT
    ice_addresses: tuple[str, ...] = ()  # host candidates to offer; empty: every interface
    jitter: JitterConfig = field(default_factory=JitterConfig)
    pumps_per_tick: int = 4  # the receive path runs every 20 ms of an 80 ms tick
    pump_lead_s: float = 0.015  # the frame is in the ring this long before the tick
    send_queue_max_s: float = 0.12  # one 80 ms frame plus slack for the pump's phase
    engine_wait_s: float = 30.0  # how long to wait for the engine at start
    # a WebRTC call whose peer has not connected this long after its answer is ended, so an
    # offer abandoned mid-setup (tab closed, ICE blocked) does not hold its slot for good
    webrtc_setup_timeout_s: float = 30.0
    ice_servers: tuple[str, ...] = ()  # STUN/TURN URLs handed to browsers by GET /v1/config
    turn_username: str | None = None  # credentials for the turn:/turns: URLs above
    turn_credential: str | None = None
    auth_token: str | None = None  # when set, the call API needs "Authorization: Bearer" it
    captions_tokenizer: Path | None = None  # sentencepiece model: text tokens -> captions
    sip_port: int = 0  # SIP over UDP and TCP for phone calls; 0: no SIP
    sip_address: str = "127.0.0.1"  # bound for SIP and RTP, and advertised in Via/Contact/SDP
    rtp_ports: tuple[int, int] = (20000, 20999)  # even ports in [low, high) carry RTP
    sip_allow: tuple[str, ...] = ()  # CIDRs allowed to send SIP; empty: every source
    rtp_timeout_s: float = 30.0  # a call whose peer sends no media this long is hung up
    sip_busy_status: int = 503  # the refusal while the engine is full or draining
    sip_ring_s: float = 0.0  # ring this long (180) before answering
    sip_register: str | None = None  # address-of-record to register (sip:user@domain)
    sip_registrar: str | None = None  # registrar URI; default: the address-of-record's domain
    sip_username: str | None = None  # digest credentials for REGISTER
    sip_password: str | None = None
    sip_proxy: tuple[str, int] | None = None  # outbound calls go here (the trunk), any URI

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"invalid port {self.port}")
        if not self.web_root.is_dir():
            raise ValueError(f"web root {self.web_root} is not a directory")
        if self.pumps_per_tick < 1:
            raise ValueError("pumps_per_tick must be at least 1")
        if not 0.0 <= self.pump_lead_s < 0.04:
            raise ValueError("pump_lead_s must be in [0, 40 ms)")
        if self.webrtc_setup_timeout_s <= 0.0:
            raise ValueError("webrtc_setup_timeout_s must be positive")
        if self.send_queue_max_s < 0.08:
            raise ValueError("send_queue_max_s must hold at least one 80 ms frame")
        for url in self.ice_servers:
            if not url.startswith(ICE_SCHEMES):
                raise ValueError(f"ICE server {url!r} is not a stun:, turn: or turns: URL")
        if self.auth_token is not None and len(self.auth_token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the auth token must have at least {MIN_TOKEN_CHARS} characters")
        if self.captions_tokenizer is not None and not self.captions_tokenizer.is_file():
            raise ValueError(f"captions tokenizer {self.captions_tokenizer} is not a file")
        self._validate_sip()

    def _validate_sip(self) -> None:
        if not 0 <= self.sip_port <= 65535:
            raise ValueError(f"invalid SIP port {self.sip_port}")
        try:
            address = ipaddress.ip_address(self.sip_address)
        except ValueError:
            raise ValueError(f"the SIP address must be an IP address: {self.sip_address}") from None
        if address.is_unspecified:
            raise ValueError("the SIP address is advertised to peers: give a concrete address")
        low, high = self.rtp_ports
        if not 1024 <= low < high <= 65535 or high - low < 2:
            raise ValueError(f"invalid RTP port range {low}-{high}")
        for network in self.sip_allow:
            try:
                ipaddress.ip_network(network, strict=False)
            except ValueError:
                raise ValueError(f"--sip-allow {network!r} is not a CIDR") from None
        if self.rtp_timeout_s <= 0:
            raise ValueError("the RTP timeout must be positive")
        if self.sip_busy_status not in SIP_BUSY_STATUSES:
            raise ValueError(f"the SIP busy status must be one of {SIP_BUSY_STATUSES}")
        if not 0 <= self.sip_ring_s <= 60:
            raise ValueError("the SIP ring time must be in [0, 60] s")
        for uri in (self.sip_register, self.sip_registrar):
            if uri is not None and not uri.startswith("sip:"):
                raise ValueError(f"{uri!r} is not a sip: URI")
        if self.sip_proxy is not None:
            host, port = self.sip_proxy
            if not host or not 0 < port <= 65535:
                raise ValueError(f"invalid SIP proxy {host}:{port}")
        if self.sip_register is not None and not self.sip_port:
            raise ValueError("registering needs SIP: give --sip-port")

    def browser_ice_servers(self) -> list[dict[str, object]]:
        """RTCIceServer dictionaries for the page, TURN credentials on the TURN URLs only."""
        servers: list[dict[str, object]] = []
        for url in self.ice_servers:
            server: dict[str, object] = {"urls": url}
            if url.startswith(("turn:", "turns:")) and self.turn_username is not None:
                server.update(username=self.turn_username, credential=self.turn_credential or "")
            servers.append(server)
        return servers
