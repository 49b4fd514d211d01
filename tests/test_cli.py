"""The engine's command line as `serve` (and `bench engine`) hand it to the engine process."""

from cadence.cli import _engine_argv, build_parser


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
