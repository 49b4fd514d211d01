"""The stream-K linear (kernels/streamed_linear.py) on the temporal layer's GEMMs against what
a few-slot tick ran before it, on one GPU.

    python bench/kernels_streamed_linear.py --rows 1,4 --json OUT.json

Per GEMM of a temporal layer (bf16, Moshi 7B shapes, random weights): microseconds per call
of what `TemporalLayer._few_rows` ran before (`tiled`: rms_norm + cuBLAS for qkv, rms_norm +
cuBLAS + gated_silu for gate/up, fused_linear's swapped split tiles for out and down with
their residual) and of the streamed kernel with each tile of SWEEP, its norm as the GEMM's
prologue; REPEATS calls captured in one CUDA graph, one after another on one stream with
programmatic dependent launch as in a tick (each starts while the one before ends), each on
another copy of the weight (together several times the L2, so weights come from HBM as in a
tick), and the weight bytes per second. Then `layer`: the four GEMMs of a layer in order
(without the attention), the tiled path against the streamed one with the default tiles,
norms as prologues and apart.
"""

import argparse
import json
import logging
import math
import os
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("NO_TORCH_COMPILE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from gpu_timing import machine, replay_ms  # bench/, this folder
from torch import Tensor
from torch.nn import functional

from engine.models.moshi.config import moshiko
from kernels.fused_linear import Tiles, fused_linear
from kernels.gated_silu import gated_silu
from kernels.rms_norm import rms_norm
from kernels.streamed_linear import DEFAULT_TILES, streamed_linear

log = logging.getLogger("kernels_streamed_linear")
REPEATS = 16
COPIES_BYTES = 1 << 30  # weight copies cycled through per graph: ~18x the L2
EPS = 1e-8
SWEEP = [
    DEFAULT_TILES,
    Tiles(64, 128, True, stages=4, programs_per_sm=2, swap=True),
    Tiles(64, 64, True, stages=8, programs_per_sm=1, swap=True),
    Tiles(128, 64, True, warps=8, stages=6, programs_per_sm=1, swap=True),
    Tiles(128, 128, True, warps=8, stages=4, programs_per_sm=1, swap=True),
    Tiles(64, 256, True, stages=3, programs_per_sm=1, swap=True),
]


def copies(rows: int, cols: int, gen: torch.Generator) -> list[Tensor]:
    count = max(2, math.ceil(COPIES_BYTES / (rows * cols * 2)))
    first = (torch.randn(rows, cols, generator=gen) * cols**-0.5).to("cuda", torch.bfloat16)
    return [first] + [first.roll(i, 0) for i in range(1, count)]


def per_call_us(calls: list[Callable[[], object]]) -> float:
    """us per call of the calls run in order, REPEATS of them per graph, cycling."""
    cycle = iter(range(1 << 30))

    def run() -> None:
        calls[next(cycle) % len(calls)]()

    times = replay_ms(run, replays=30, repeats=REPEATS)
    return round(statistics.median(times) * 1e3 / REPEATS, 2)


def gemms(rows: int) -> dict[str, Any]:
    """Each of a temporal layer's GEMMs, tiled and streamed."""
    lm = moshiko().lm
    dim, hidden = lm.dim, lm.ffn_hidden
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 1, dim, generator=gen).to("cuda", torch.bfloat16)
    wide = torch.randn(rows, 1, hidden, generator=gen).to("cuda", torch.bfloat16)
    alpha = torch.ones(1, 1, dim, device="cuda", dtype=torch.bfloat16)
    shapes: dict[str, tuple[list[Tensor], Tensor, dict[str, Any]]] = {
        "qkv": (copies(3 * dim, dim, gen), x, {"alpha": alpha, "eps": EPS}),
        "out": (copies(dim, dim, gen), x, {"residual": x}),
        "gate_up": (copies(2 * hidden, dim, gen), x, {"alpha": alpha, "eps": EPS, "gated": True}),
        "down": (copies(dim, hidden, gen), wide, {"residual": x}),
    }

    def tiled(name: str, weight: Tensor, src: Tensor) -> Callable[[], object]:
        if name == "qkv":
            return lambda: functional.linear(rms_norm(src, alpha, EPS), weight)
        if name == "gate_up":
            return lambda: gated_silu(functional.linear(rms_norm(src, alpha, EPS), weight))
        return lambda: fused_linear(src, weight, residual=x)

    result: dict[str, Any] = {}
    for name, (weights, src, options) in shapes.items():
        mb = weights[0].numel() * 2 / 1e6
        row: dict[str, Any] = {"weight_mb": round(mb, 1)}
        arms: dict[str, list[Callable[[], object]]] = {
            "tiled": [tiled(name, w, src) for w in weights]
        }
        for tiles in SWEEP:
            arms[str(tiles)] = [
                lambda w=w, t=tiles: streamed_linear(src, w, tiles=t, **options) for w in weights
            ]
        for arm, calls in arms.items():
            us = per_call_us(calls)
            row[arm] = {"us": us, "tb_per_s": round(mb / us / 1e6, 3)}
            log.info("%d rows %s %s %s", rows, name, arm, row[arm])
        result[name] = row
    return result


def layer(rows: int) -> dict[str, Any]:
    """A temporal layer's four GEMMs in order, without the attention: us per layer."""
    lm = moshiko().lm
    dim, hidden = lm.dim, lm.ffn_hidden
    gen = torch.Generator().manual_seed(1)
    layers = max(2, math.ceil(COPIES_BYTES / ((4 * dim + 3 * hidden) * dim * 2)))
    qkv, out = copies(3 * dim, dim, gen)[:1], copies(dim, dim, gen)[:1]
    gate_up, down = copies(2 * hidden, dim, gen)[:1], copies(dim, hidden, gen)[:1]
    stacks = [
        (qkv[0].roll(i, 0), out[0].roll(i, 0), gate_up[0].roll(i, 0), down[0].roll(i, 0))
        for i in range(layers)
    ]
    x = torch.randn(rows, 1, dim, generator=gen).to("cuda", torch.bfloat16)
    alpha = torch.ones(1, 1, dim, device="cuda", dtype=torch.bfloat16)

    def tiled(weights: tuple[Tensor, ...]) -> Callable[[], object]:
        w_qkv, w_out, w_gate_up, w_down = weights

        def run() -> None:
            head = functional.linear(rms_norm(x, alpha, EPS), w_qkv)[..., :dim]
            y = fused_linear(head, w_out, residual=x)
            gated = gated_silu(functional.linear(rms_norm(y, alpha, EPS), w_gate_up))
            fused_linear(gated, w_down, residual=y)

        return run

    def streamed(weights: tuple[Tensor, ...], norms: bool) -> Callable[[], object]:
        w_qkv, w_out, w_gate_up, w_down = weights

        def normed(src: Tensor, weight: Tensor, gated: bool) -> Tensor:
            if norms:
                return streamed_linear(src, weight, alpha=alpha, eps=EPS, gated=gated)
            return streamed_linear(rms_norm(src, alpha, EPS), weight, gated=gated)

        def run() -> None:
            head = normed(x, w_qkv, False)[..., :dim]
            y = streamed_linear(head, w_out, residual=x)
            streamed_linear(normed(y, w_gate_up, True), w_down, residual=y)

        return run

    arms = {
        "tiled": [tiled(w) for w in stacks],
        "streamed": [streamed(w, True) for w in stacks],
        "streamed_norm_apart": [streamed(w, False) for w in stacks],
    }
    # alternated, twice: the machine is shared and noisy
    found: dict[str, Any] = {}
    for round_ in range(2):
        for arm, calls in arms.items():
            found[arm + ("_again" if round_ else "")] = per_call_us(calls)
            log.info("%d rows layer %s %s", rows, arm, found[arm + ("_again" if round_ else "")])
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,4")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    result: dict[str, Any] = {"command": " ".join(sys.argv), "machine": machine(), "rows": []}
    with torch.no_grad():
        for rows in (int(r) for r in args.rows.split(",")):
            result["rows"].append({"rows": rows, "gemms": gemms(rows), "layer_us": layer(rows)})
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
