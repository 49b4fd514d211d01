"""What the demo page is configured with: ICE servers, the API token, the captions file,
from `cadence serve` flags through the gateway's argv into its typed config."""

from pathlib import Path

import pytest

from cadence.cli import _gateway_argv, _gateway_secrets, build_parser
from gateway.app import _same_token
from gateway.config import GatewayConfig

TOKEN = "a-long-enough-token-1234"


def test_serve_hands_the_page_flags_to_its_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokenizer = tmp_path / "tokenizer.model"
    tokenizer.write_bytes(b"spm")
    serve = build_parser().parse_args(
        [
            "serve",
            "--ice-server=stun:stun.example.org",
            "--ice-server=turns:turn.example.org:443",
            "--turn-username=u",
            "--turn-credential=c",
            f"--auth-token={TOKEN}",
            f"--captions-tokenizer={tokenizer}",
        ]
    )
    argv = _gateway_argv(serve)
    assert not any(TOKEN in arg or arg.endswith("=c") for arg in argv), "no secret on argv"
    for env, value in _gateway_secrets(serve).items():  # what serve puts in the child's env
        monkeypatch.setenv(env, value)
    gateway = build_parser().parse_args(["gateway", "--engine-control=/tmp/x.sock", *argv])
    assert gateway.ice_server == ["stun:stun.example.org", "turns:turn.example.org:443"]
    assert (gateway.turn_username, gateway.turn_credential) == ("u", "c")
    assert gateway.auth_token == TOKEN
    assert gateway.captions_tokenizer == tokenizer


def test_without_page_flags_the_gateway_gets_none() -> None:
    serve = build_parser().parse_args(["serve"])
    assert not any(
        flag in arg
        for arg in _gateway_argv(serve)
        for flag in ("ice-server", "turn-", "auth-token", "captions")
    )


def test_turn_credentials_go_only_to_turn_servers() -> None:
    config = GatewayConfig(
        Path("/tmp/x.sock"),
        ice_servers=("stun:s.example.org", "turn:t.example.org?transport=tcp"),
        turn_username="u",
        turn_credential="c",
    )
    assert config.browser_ice_servers() == [
        {"urls": "stun:s.example.org"},
        {"urls": "turn:t.example.org?transport=tcp", "username": "u", "credential": "c"},
    ]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("ice_servers", ("http://stun.example.org",), "not a stun:"),
        ("auth_token", "short", "at least 16"),
        ("captions_tokenizer", Path("/nonexistent/tokenizer.model"), "is not a file"),
    ],
)
def test_bad_page_settings_are_refused_at_start(field: str, value: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GatewayConfig(Path("/tmp/x.sock"), **{field: value})  # type: ignore[arg-type]


def test_a_token_header_that_is_no_text_is_refused_not_a_crash() -> None:
    assert _same_token(TOKEN, TOKEN)
    assert not _same_token(TOKEN[:-1], TOKEN)
    assert not _same_token("\udcff" + TOKEN[1:], TOKEN)  # a raw 0xff byte, as aiohttp decodes it
