"""The command line: what `serve` (and `bench engine`) hand their child processes, and what
`serve` refuses before starting any."""

import dataclasses
import subprocess
import sys

import pytest

from cadence.cli import _engine_argv, _gateway_argv, _gateway_config, build_parser
from engine.models import ModelOptions


def _engine_args_of(serve_argv: list[str]) -> list[str]:
    return _engine_argv(build_parser().parse_args(["serve", *serve_argv]))


def test_dependent_launch_is_on_unless_turned_off() -> None:
    assert "--no-dependent-launch" not in _engine_args_of([])
    engine_argv = _engine_args_of(["--model=moshi", "--random-weights", "--no-dependent-launch"])
    assert "--no-dependent-launch" in engine_argv
    engine = build_parser().parse_args(
        ["engine", "--control=/tmp/c.sock", "--ring=r", *engine_argv]
    )
    assert engine.dependent_launch is False
    default = build_parser().parse_args(["engine", "--control=/tmp/c.sock", "--ring=r"])
    assert default.dependent_launch is True


@pytest.mark.parametrize(
    ("flag", "asked"),
    [
        ("mimi_glue_kernels", ModelOptions(random_weights=0, mimi_glue_kernels=True)),
        ("rope_in_attention", ModelOptions(random_weights=0, rope_in_attention=True)),
    ],
)
def test_held_off_kernels_are_off_unless_asked_and_only_on_cuda(
    flag: str, asked: ModelOptions
) -> None:
    """--mimi-glue-kernels and --rope-in-attention (kernels not yet timed on a GPU)."""
    option = "--" + flag.replace("_", "-")
    assert option not in _engine_args_of([])
    engine_argv = _engine_args_of(["--model=moshi", "--random-weights", "--device=cuda", option])
    assert option in engine_argv
    engine = build_parser().parse_args(
        ["engine", "--control=/tmp/c.sock", "--ring=r", *engine_argv]
    )
    assert getattr(engine, flag) is True
    dataclasses.replace(asked, device="cuda").check("moshi")
    for model, device in (("moshi", "cpu"), ("echo", "cuda")):
        with pytest.raises(ValueError, match=f"{option} is for"):
            dataclasses.replace(asked, device=device).check(model)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--rtp-ports=30000-20000", "invalid RTP port range"),  # the gateway's
        ("--slots=0", "slots must be in"),  # the engine's
        ("--webrtc-setup-timeout-s=0", "webrtc_setup_timeout_s must be positive"),
    ],
)
def test_serve_refuses_a_bad_option_before_starting_anything(option: str, message: str) -> None:
    serve = subprocess.run(
        [sys.executable, "-m", "cadence", "serve", "--port=0", "--metrics-port=0", option],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert serve.returncode == 2, serve.stderr
    assert serve.stderr.count(message) == 1, "said once, by serve: no child tried and retried"


def test_serve_hands_the_setup_timeout_to_its_gateway() -> None:
    serve = build_parser().parse_args(["serve", "--webrtc-setup-timeout-s=12.5"])
    gateway = build_parser().parse_args(
        ["gateway", "--engine-control=/tmp/x.sock", *_gateway_argv(serve)]
    )
    assert _gateway_config(gateway, gateway.engine_control).webrtc_setup_timeout_s == 12.5
