"""The `cadence` command: serve (engine + gateway), engine, gateway, infer, bench.

The only place that reads command-line arguments; it builds each process's typed config and
hands it over.
"""

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from engine.executors import EXECUTORS
from engine.infer import add_infer_arguments, run_infer
from engine.models import KV_DTYPES, MODELS, ModelOptions

if TYPE_CHECKING:
    from engine.config import EngineConfig
    from gateway.config import GatewayConfig

log = logging.getLogger("cadence")

# flag destination -> environment variable that may carry it instead
SECRETS = {
    "turn_credential": "CADENCE_TURN_CREDENTIAL",
    "auth_token": "CADENCE_AUTH_TOKEN",
    "sip_password": "CADENCE_SIP_PASSWORD",
}


def _engine_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("engine")
    g.add_argument("--model", default="echo", choices=MODELS, help="model to serve")
    g.add_argument("--executor", default="eager", choices=EXECUTORS, help="how the step runs")
    g.add_argument("--slots", type=int, default=32, help="concurrent calls (batch rows)")
    g.add_argument(
        "--tick-ms", type=float, default=80.0, help="tick period, ms (the model's frame)"
    )
    g.add_argument("--ring-depth", type=int, default=4, help="frames per shared-memory ring")
    g.add_argument("--metrics-host", default="127.0.0.1", help="engine /metrics address")
    g.add_argument("--metrics-port", type=int, default=9101, help="engine /metrics port (0: off)")
    g.add_argument(
        "--watchdog-s",
        type=float,
        default=10.0,
        help="a step running longer than this is hung: the engine exits and `serve` restarts "
        "it (0: off)",
    )
    g.add_argument(
        "--test-hooks",
        action="store_true",
        help="accept test-only control ops (an induced tick stall); never in production",
    )
    m = p.add_argument_group("model weights (moshi)")
    m.add_argument("--checkpoint", type=Path, help="checkpoint directory (Kyutai/NVIDIA layout)")
    m.add_argument(
        "--random-weights",
        type=int,
        nargs="?",
        const=0,
        metavar="SEED",
        help="seeded random weights instead of a checkpoint (audio and captions are noise)",
    )
    m.add_argument(
        "--config", default="7b", help="tiny | 7b | moshiko | personaplex | a .json/.toml file"
    )
    m.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    m.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bf16 on CUDA")
    m.add_argument("--greedy", action="store_true", help="greedy decoding instead of sampling")
    m.add_argument(
        "--kv-dtype",
        default="bf16",
        choices=KV_DTYPES,
        help="temporal KV cache: bf16 (the model's dtype) or fp8 (e4m3, a scale per entry; "
        "half the memory per call, docs/kv-cache.md)",
    )
    m.add_argument(
        "--no-dependent-launch",
        dest="dependent_launch",
        action="store_false",
        help="launch the Triton kernels without programmatic dependent launch (on by default "
        "on Hopper and newer GPUs: a kernel starts while the one before finishes)",
    )
    m.add_argument(
        "--no-mimi-glue-kernels",
        dest="mimi_glue_kernels",
        action="store_false",
        help="run Mimi's glue in torch's ops instead of its Triton kernels (on by default on "
        "CUDA: a transposed convolution's overlap-add, a residual block's end and a "
        "transformer step's RoPE tables, one launch each; docs/gpu-log.md)",
    )
    m.add_argument(
        "--no-rope-in-attention",
        dest="rope_in_attention",
        action="store_false",
        help="run the temporal attention's RoPE and ring append in a launch of their own "
        "(kernels/kv_append.py) instead of inside the attention's (kernels/rope_attention.py; "
        "on by default on CUDA with bf16 rings)",
    )
    m.add_argument("--voice-prompt", type=Path, help="PersonaPlex: WAV of the voice to speak with")
    m.add_argument("--text-prompt", help="PersonaPlex: the role text (needs the tokenizer)")


def _secret_option(group: argparse._ArgumentGroup, dest: str, help_text: str) -> None:
    """A flag whose value may come from its environment variable in SECRETS instead."""
    env = SECRETS[dest]
    group.add_argument(
        "--" + dest.replace("_", "-"),
        dest=dest,
        default=os.environ.get(env),
        help=f"{help_text} (or ${env}, which keeps it off the process list)",
    )


def _gateway_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("gateway")
    g.add_argument("--host", default="127.0.0.1", help="HTTP listen address")
    g.add_argument("--port", type=int, default=8080, help="HTTP port (API, page, /metrics)")
    g.add_argument(
        "--web-root", type=Path, help="directory of the demo page (default: the source tree's web/)"
    )
    g.add_argument(
        "--ice-address",
        action="append",
        default=[],
        metavar="ADDR",
        help="offer only this local address as a WebRTC host candidate (repeatable)",
    )
    g.add_argument(
        "--webrtc-setup-timeout-s",
        type=float,
        default=30.0,
        help="end a WebRTC call whose browser has not connected this long after the answer",
    )
    g.add_argument(
        "--ice-server",
        action="append",
        default=[],
        metavar="URL",
        help="STUN/TURN server URL the demo page's browser uses (repeatable)",
    )
    g.add_argument("--turn-username", help="username for the turn: ICE servers")
    _secret_option(g, "turn_credential", "credential for the turn: ICE servers")
    _secret_option(g, "auth_token", "require 'Authorization: Bearer TOKEN' on the call API")
    g.add_argument(
        "--captions-tokenizer",
        type=Path,
        metavar="FILE",
        help="sentencepiece model of the served model's text tokens: send live captions",
    )
    g.add_argument(
        "--jitter-min-ms", type=float, default=40.0, help="jitter buffer's lowest target delay"
    )
    s = p.add_argument_group("phone calls (SIP/RTP)")
    s.add_argument(
        "--sip-port", type=int, default=0, help="SIP port, UDP and TCP (0: no SIP; 5060 usual)"
    )
    s.add_argument(
        "--sip-address",
        default="127.0.0.1",
        help="address SIP and RTP bind to and advertise (Via, Contact, SDP)",
    )
    s.add_argument(
        "--rtp-ports", default="20000-20999", metavar="LOW-HIGH", help="RTP port range (even ports)"
    )
    s.add_argument(
        "--sip-allow",
        action="append",
        default=[],
        metavar="CIDR",
        help="accept SIP only from this network (repeatable; default: every source)",
    )
    s.add_argument(
        "--rtp-timeout-s", type=float, default=30.0, help="hang up after this long without RTP"
    )
    s.add_argument(
        "--sip-busy",
        type=int,
        default=503,
        choices=[503, 486],
        help="answer to calls while the engine is full: 503 + Retry-After, or 486 Busy Here",
    )
    s.add_argument(
        "--sip-ring-ms", type=float, default=0.0, help="ring (180) this long before answering"
    )
    s.add_argument(
        "--sip-register", metavar="AOR", help="register this sip: address-of-record at a trunk"
    )
    s.add_argument("--sip-registrar", metavar="URI", help="registrar (default: the AOR's domain)")
    s.add_argument("--sip-username", help="digest username for --sip-register")
    _secret_option(s, "sip_password", "digest password for --sip-register")
    s.add_argument(
        "--sip-proxy",
        metavar="HOST[:PORT]",
        help="send outbound calls (and the REGISTER unless --sip-registrar) through this trunk",
    )
    g.add_argument(
        "--jitter-max-ms", type=float, default=200.0, help="jitter buffer's highest target delay"
    )


def _engine_argv(a: argparse.Namespace) -> list[str]:
    return [
        f"--model={a.model}",
        f"--executor={a.executor}",
        f"--slots={a.slots}",
        f"--tick-ms={a.tick_ms}",
        f"--ring-depth={a.ring_depth}",
        f"--metrics-host={a.metrics_host}",
        f"--metrics-port={a.metrics_port}",
        f"--log-level={a.log_level}",
        f"--watchdog-s={a.watchdog_s}",
        *(["--test-hooks"] if a.test_hooks else []),
        f"--config={a.config}",
        f"--device={a.device}",
        *([f"--checkpoint={a.checkpoint}"] if a.checkpoint else []),
        *([f"--random-weights={a.random_weights}"] if a.random_weights is not None else []),
        *([f"--dtype={a.dtype}"] if a.dtype else []),
        *(["--greedy"] if a.greedy else []),
        f"--kv-dtype={a.kv_dtype}",
        *([] if a.dependent_launch else ["--no-dependent-launch"]),
        *([] if a.mimi_glue_kernels else ["--no-mimi-glue-kernels"]),
        *([] if a.rope_in_attention else ["--no-rope-in-attention"]),
        *([f"--voice-prompt={a.voice_prompt}"] if a.voice_prompt else []),
        *([f"--text-prompt={a.text_prompt}"] if a.text_prompt else []),
    ]


def _gateway_argv(a: argparse.Namespace) -> list[str]:
    argv = [
        f"--host={a.host}",
        f"--port={a.port}",
        f"--jitter-min-ms={a.jitter_min_ms}",
        f"--jitter-max-ms={a.jitter_max_ms}",
        f"--log-level={a.log_level}",
        f"--sip-port={a.sip_port}",
        f"--sip-address={a.sip_address}",
        f"--rtp-ports={a.rtp_ports}",
        f"--rtp-timeout-s={a.rtp_timeout_s}",
        f"--webrtc-setup-timeout-s={a.webrtc_setup_timeout_s}",
        f"--sip-busy={a.sip_busy}",
        f"--sip-ring-ms={a.sip_ring_ms}",
    ]
    argv += [f"--sip-allow={cidr}" for cidr in a.sip_allow]
    argv += [f"--ice-address={addr}" for addr in a.ice_address]
    argv += [f"--ice-server={url}" for url in a.ice_server]
    optional = {
        "turn-username": a.turn_username,
        "captions-tokenizer": a.captions_tokenizer,
        "web-root": a.web_root,
        "sip-register": a.sip_register,
        "sip-registrar": a.sip_registrar,
        "sip-username": a.sip_username,
        "sip-proxy": a.sip_proxy,
    }
    return argv + [f"--{flag}={value}" for flag, value in optional.items() if value is not None]


def _gateway_secrets(a: argparse.Namespace) -> dict[str, str]:
    """Secrets reach the gateway child through its environment, not its command line, which
    every local user can read in /proc."""
    return {env: getattr(a, name) for name, env in SECRETS.items() if getattr(a, name)}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="cadence", description="Serve full-duplex speech models to many live calls."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run an engine and a gateway together (the demo)")
    _engine_options(serve)
    _gateway_options(serve)
    serve.add_argument(
        "--ready-timeout",
        type=_positive_seconds,
        default=120.0,
        help="seconds to wait for the engine",
    )

    engine = sub.add_parser("engine", help="run the engine process alone")
    _engine_options(engine)
    engine.add_argument("--control", type=Path, required=True, help="admission socket path")
    engine.add_argument("--ring", required=True, help="shared-memory segment name")

    gateway = sub.add_parser("gateway", help="run a gateway process against a running engine")
    _gateway_options(gateway)
    gateway.add_argument(
        "--engine-control", type=Path, required=True, help="the engine's admission socket"
    )

    bench = sub.add_parser(
        "bench", help="measure: `cadence bench engine` holds N calls on a real engine"
    )
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    bench_engine = bench_sub.add_parser(
        "engine", help="open --slots calls on a real engine for --seconds and count deadline misses"
    )
    _engine_options(bench_engine)
    bench_engine.set_defaults(metrics_port=0)  # beside a running serve, no port clash
    bench_engine.add_argument(
        "--seconds",
        type=_positive_seconds,
        default=130.0,
        help="how long to tick; past the KV context (2 min) for the worst case, full rings",
    )
    bench_engine.add_argument(
        "--sweep",
        type=_call_counts,
        help="call counts to try, e.g. 280,300,320 (one engine each, ascending, stopping at the "
        "first that misses a deadline); default: --slots",
    )
    bench_engine.add_argument(
        "--full-context",
        action="store_true",
        help="age every call's attention context to full first (the engine gets --test-hooks): "
        "the per-tick cost of calls two minutes in, without the two minutes",
    )
    bench_engine.add_argument("--json", type=Path, help="write the result here too")
    bench_engine.add_argument(
        "--ready-timeout",
        type=_positive_seconds,
        default=600.0,
        help="seconds to wait for the engine",
    )

    infer = sub.add_parser(
        "infer", help="run a WAV file through a model offline, with the live engine's step"
    )
    add_infer_arguments(infer)

    for p in (serve, engine, gateway, infer, bench_engine):
        p.add_argument("--log-level", default="info", choices=["debug", "info", "warning"])
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format=f"%(asctime)s {args.command:7s} %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        return _dispatch(args)
    except ValueError as exc:  # configuration errors: one clear line, no traceback
        log.error("%s", exc)
        return 2


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "infer":
        return run_infer(args)
    if args.command == "bench":
        from cadence.bench import bench_engine

        return bench_engine(
            args, lambda calls: _engine_argv(argparse.Namespace(**{**vars(args), "slots": calls}))
        )
    if args.command == "serve":
        from cadence.supervise import Supervisor

        # both children's configurations are checked here, before a model loads: a bad option
        # is one clear error now, not a child's exit that the supervisor would restart
        _engine_config(args, Path("engine.sock"), "cadence-check")
        _gateway_config(args, Path("engine.sock"))
        supervisor = Supervisor(
            _engine_argv(args), _gateway_argv(args), _gateway_secrets(args), args.ready_timeout
        )
        return supervisor.run()
    if args.command == "engine":
        from engine.main import run_engine

        return run_engine(_engine_config(args, args.control, args.ring))
    from gateway.main import run_gateway

    return run_gateway(_gateway_config(args, args.engine_control))


def _engine_config(args: argparse.Namespace, control: Path, ring: str) -> "EngineConfig":
    from engine.config import EngineConfig

    return EngineConfig(
        control_path=control,
        ring_name=ring,
        slots=args.slots,
        model=args.model,
        executor=args.executor,
        tick_period_s=args.tick_ms / 1000.0,
        ring_depth=args.ring_depth,
        metrics_host=args.metrics_host,
        metrics_port=args.metrics_port,
        test_hooks=args.test_hooks,
        watchdog_s=args.watchdog_s,
        model_options=ModelOptions(
            checkpoint=args.checkpoint,
            config=args.config,
            random_weights=args.random_weights,
            device=args.device,
            dtype=args.dtype,
            greedy=args.greedy,
            kv_dtype=args.kv_dtype,
            dependent_launch=args.dependent_launch,
            mimi_glue_kernels=args.mimi_glue_kernels,
            rope_in_attention=args.rope_in_attention,
            voice_prompt=args.voice_prompt,
            text_prompt=args.text_prompt,
        ),
    )


def _gateway_config(args: argparse.Namespace, engine_control: Path) -> "GatewayConfig":
    from gateway.config import GatewayConfig
    from gateway.media.jitter import JitterConfig

    return GatewayConfig(
        engine_control=engine_control,
        host=args.host,
        port=args.port,
        ice_addresses=tuple(args.ice_address),
        ice_servers=tuple(args.ice_server),
        turn_username=args.turn_username,
        turn_credential=args.turn_credential,
        auth_token=args.auth_token,
        captions_tokenizer=args.captions_tokenizer,
        **({"web_root": args.web_root} if args.web_root else {}),
        jitter=JitterConfig(
            min_delay_s=args.jitter_min_ms / 1000.0, max_delay_s=args.jitter_max_ms / 1000.0
        ),
        webrtc_setup_timeout_s=args.webrtc_setup_timeout_s,
        sip_port=args.sip_port,
        sip_address=args.sip_address,
        rtp_ports=_port_range(args.rtp_ports),
        sip_allow=tuple(args.sip_allow),
        rtp_timeout_s=args.rtp_timeout_s,
        sip_busy_status=args.sip_busy,
        sip_ring_s=args.sip_ring_ms / 1000.0,
        sip_register=args.sip_register,
        sip_registrar=args.sip_registrar,
        sip_username=args.sip_username,
        sip_password=args.sip_password,
        sip_proxy=_host_port(args.sip_proxy) if args.sip_proxy else None,
    )


def _host_port(text: str) -> tuple[str, int]:
    """`--sip-proxy`: HOST, HOST:PORT, an IPv6 address bare or as [ADDR] or [ADDR]:PORT."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            raise ValueError(f"--sip-proxy wants HOST[:PORT] or [IPV6]:PORT, not {text!r}")
        return host, int(rest[1:]) if rest else 5060
    if text.count(":") > 1:  # a bare IPv6 address: its last group is no port
        return text, 5060
    host, colon, port = text.rpartition(":")
    if not colon or not port.isdigit():
        return text, 5060
    return host, int(port)


def _port_range(text: str) -> tuple[int, int]:
    low, dash, high = text.partition("-")
    if not dash or not low.isdigit() or not high.isdigit():
        raise ValueError(f"--rtp-ports wants LOW-HIGH, not {text!r}")
    return int(low), int(high)


def _positive_seconds(text: str) -> float:
    """`--seconds`: a run of no time would report zero misses over zero ticks as a pass;
    `--ready-timeout`: no time to get ready is a failure before the engine starts."""
    try:
        seconds = float(text)
    except ValueError:
        seconds = 0.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"wants a positive number of seconds, not {text!r}")
    return seconds


def _call_counts(text: str) -> list[int]:
    """`--sweep 280,300,320`: positive call counts."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"wants positive call counts like 128,144, not {text!r}")
    return counts
