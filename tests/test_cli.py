"""The command line: what `serve` (and `bench engine`) hand their child processes, and what
`serve` refuses before starting any."""

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


@pytest.mark.parametrize("flag", ["mimi_glue_kernels", "rope_in_attention"])
def test_fused_kernel_switches_are_on_unless_turned_off(flag: str) -> None:
    """--no-mimi-glue-kernels and --no-rope-in-attention reach the engine from serve; without
    them the kernels are on (build_model applies them on CUDA only)."""
    option = "--no-" + flag.replace("_", "-")
    assert option not in _engine_args_of([])
    default = build_parser().parse_args(["engine", "--control=/tmp/c.sock", "--ring=r"])
    assert getattr(default, flag) is True
    assert getattr(ModelOptions(), flag) is True
    engine_argv = _engine_args_of(["--model=moshi", "--random-weights", "--device=cuda", option])
    assert option in engine_argv
    engine = build_parser().parse_args(
        ["engine", "--control=/tmp/c.sock", "--ring=r", *engine_argv]
    )
    assert getattr(engine, flag) is False
    # turning them off is valid wherever they could be on or are ignored
    for model, device in (("moshi", "cpu"), ("moshi", "cuda"), ("echo", "cpu")):
        seed = 0 if model == "moshi" else None
        ModelOptions(
            random_weights=seed, device=device, mimi_glue_kernels=False, rope_in_attention=False
        ).check(model)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ("--rtp-ports=30000-20000", "invalid RTP port range"),  # the gateway's
        ("--slots=0", "slots must be in"),  # the engine's
        ("--webrtc-setup-timeout-s=0", "webrtc_setup_timeout_s must be positive"),
        ("--jitter-min-ms=300", "got min 300 ms and max 200 ms"),  # both bounds, in the flags' unit
        ("--ready-timeout=0", "wants a positive number of seconds"),
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
