"""The gateway process's one typed configuration, validated when built."""

from dataclasses import dataclass, field
from pathlib import Path

from gateway.media.jitter import JitterConfig

WEB_ROOT = Path(__file__).resolve().parent.parent / "web"
ICE_SCHEMES = ("stun:", "stuns:", "turn:", "turns:")
MIN_TOKEN_CHARS = 16  # a guessable bearer token protects nothing


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
    ice_servers: tuple[str, ...] = ()  # STUN/TURN URLs handed to browsers by GET /v1/config
    turn_username: str | None = None  # credentials for the turn:/turns: URLs above
    turn_credential: str | None = None
    auth_token: str | None = None  # when set, the call API needs "Authorization: Bearer" it
    captions_tokenizer: Path | None = None  # sentencepiece model: text tokens -> captions

    def __post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"invalid port {self.port}")
        if not self.web_root.is_dir():
            raise ValueError(f"web root {self.web_root} is not a directory")
        if self.pumps_per_tick < 1:
            raise ValueError("pumps_per_tick must be at least 1")
        if not 0.0 <= self.pump_lead_s < 0.04:
            raise ValueError("pump_lead_s must be in [0, 40 ms)")
        if self.send_queue_max_s < 0.08:
            raise ValueError("send_queue_max_s must hold at least one 80 ms frame")
        for url in self.ice_servers:
            if not url.startswith(ICE_SCHEMES):
                raise ValueError(f"ICE server {url!r} is not a stun:, turn: or turns: URL")
        if self.auth_token is not None and len(self.auth_token) < MIN_TOKEN_CHARS:
            raise ValueError(f"the auth token must have at least {MIN_TOKEN_CHARS} characters")
        if self.captions_tokenizer is not None and not self.captions_tokenizer.is_file():
            raise ValueError(f"captions tokenizer {self.captions_tokenizer} is not a file")

    def browser_ice_servers(self) -> list[dict[str, object]]:
        """RTCIceServer dictionaries for the page, TURN credentials on the TURN URLs only."""
        servers: list[dict[str, object]] = []
        for url in self.ice_servers:
            server: dict[str, object] = {"urls": url}
            if url.startswith(("turn:", "turns:")) and self.turn_username is not None:
                server.update(username=self.turn_username, credential=self.turn_credential or "")
            servers.append(server)
        return servers
